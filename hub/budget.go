package hub

import (
	"hash/maphash"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// rewatchGrace is how long what a user's closed connection watched stays
// free to subscribe again on this node. An SSE stream's subscription is
// its URL, so a client asks for refused ids again by reconnecting with
// every id it holds: were those charged anew, a budget smaller than the
// subscription would refuse the same tail on every reconnect and the
// client would never hold it all.
const rewatchGrace = 10 * time.Second

// readBudgets are the per-user token buckets that snapshot reads caused by
// subscriptions draw from: a client subscribing to fresh ids as fast as it
// can costs Redis and PostgreSQL at most its user's budget, and no other
// user's. One bucket per tenant and user with a bucket not full; full ones
// are forgotten by sweep. Alongside, per user, what its connections
// watched until they closed and what its subscriptions paid for lately
// (rewatchGrace after the last of either), which costs nothing to watch
// again: many connections of one user asking for one task at once (a
// reconnect storm) pay for it once, and re-watching is bounded by the
// user's connect rate times the subscriptions a connection may hold, not
// by this budget. What is free is decided by the user's own history only,
// never by what other users watch: that would tell a task hidden from the
// user from an absent one.
type readBudgets struct {
	perSecond  rate.Limit
	burst      int
	maxRewatch int // watches kept per user; past it, a closing connection's are not kept

	seed   maphash.Seed
	shards [budgetShards]budgetShard
}

// budgetShards spreads the users over locks of their own. Every
// subscribing connection takes its user's while it holds its own lock,
// which the writers wait for: on one lock, a herd of new connections (a
// lost node's clients) queued there and held the writers with them.
const budgetShards = 32

// budgetShard is the users of readBudgets whose key hashes to it.
type budgetShard struct {
	mu      sync.Mutex
	buckets map[key]*rate.Limiter
	rewatch map[key]*rewatchSet
	_       [40]byte // keep shards on separate cache lines
}

func (b *readBudgets) shard(k key) *budgetShard {
	return &b.shards[maphash.Comparable(b.seed, k)%budgetShards]
}

// rewatchSet is what a user's connections watched when they closed, or
// paid for, free to watch again until the grace of the last of them has
// passed. Its first watch is kept inline and the map made for a second:
// most users, one browser each, subscribe to little at a time.
type rewatchSet struct {
	until    time.Time
	first    watch
	hasFirst bool
	ws       map[watch]struct{} // the others; nil until there are any
}

func (r *rewatchSet) has(w watch) bool {
	if r.hasFirst && r.first == w {
		return true
	}
	_, ok := r.ws[w]
	return ok
}

// add keeps w unless the set holds max watches already.
func (r *rewatchSet) add(w watch, max int) {
	switch n := len(r.ws); {
	case r.has(w):
	case !r.hasFirst:
		r.first, r.hasFirst = w, true
	case n+1 >= max:
	case r.ws == nil:
		r.ws = map[watch]struct{}{w: {}}
	default:
		r.ws[w] = struct{}{}
	}
}

// watch is one thing a connection watches: a task or project (by byTask or
// byProject, with its id) or its user's tasks (byUser, no id).
type watch struct {
	by int
	id string
}

func (b *readBudgets) init(perSecond float64, burst, maxRewatch int) {
	b.perSecond, b.burst, b.maxRewatch = rate.Limit(perSecond), burst, maxRewatch
	b.seed = maphash.MakeSeed()
	for i := range b.shards {
		b.shards[i].buckets = make(map[key]*rate.Limiter)
		b.shards[i].rewatch = make(map[key]*rewatchSet)
	}
}

// take takes one read for the user and reports whether it got it; when
// not, wait is how long until the next one is allowed.
func (b *readBudgets) take(k key, now time.Time) (ok bool, wait time.Duration) {
	sh := b.shard(k)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	lim := sh.buckets[k]
	if lim == nil {
		lim = rate.NewLimiter(b.perSecond, b.burst)
		sh.buckets[k] = lim
	}
	r := lim.ReserveN(now, 1)
	if wait = r.DelayFrom(now); wait > 0 {
		r.CancelAt(now) // a refused read takes nothing from the bucket
		return false, wait
	}
	return true, 0
}

// closed records what a connection of the user watched when it closed at
// now: watching it again within rewatchGrace is free. The grace is the
// user's, from its last connection to close or read paid for, so that
// sweep costs one check per user.
func (b *readBudgets) closed(k key, ws []watch, now time.Time) {
	if len(ws) == 0 {
		return
	}
	sh := b.shard(k)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	b.keepLocked(sh, k, ws, now)
}

// paid records a read the user's subscription paid for at now: its other
// connections watch w for free within rewatchGrace, as after a close.
func (b *readBudgets) paid(k key, w watch, now time.Time) {
	sh := b.shard(k)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	b.keepLocked(sh, k, []watch{w}, now)
}

// keepLocked makes ws free for the user until rewatchGrace after now. sh
// is k's shard, locked.
func (b *readBudgets) keepLocked(sh *budgetShard, k key, ws []watch, now time.Time) {
	r := sh.rewatch[k]
	if r == nil || !now.Before(r.until) {
		r = &rewatchSet{}
		sh.rewatch[k] = r
	}
	r.until = now.Add(rewatchGrace)
	for _, w := range ws {
		r.add(w, b.maxRewatch)
	}
}

// rewatched reports whether one of the user's connections that closed
// within rewatchGrace before now watched w.
func (b *readBudgets) rewatched(k key, w watch, now time.Time) bool {
	sh := b.shard(k)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	r := sh.rewatch[k]
	if r == nil || !now.Before(r.until) {
		return false
	}
	return r.has(w)
}

// sweep forgets the buckets that have refilled, as they are as a new one,
// and the watches whose grace has passed.
func (b *readBudgets) sweep(now time.Time) {
	for i := range b.shards {
		sh := &b.shards[i]
		sh.mu.Lock()
		for k, lim := range sh.buckets {
			if lim.TokensAt(now) >= float64(b.burst) {
				delete(sh.buckets, k)
			}
		}
		for k, r := range sh.rewatch {
			if !now.Before(r.until) {
				delete(sh.rewatch, k)
			}
		}
		sh.mu.Unlock()
	}
}
