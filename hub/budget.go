package hub

import (
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// readBudgets are the per-user token buckets that snapshot reads caused by
// subscriptions draw from: a client subscribing to fresh ids as fast as it
// can costs Redis and PostgreSQL at most its user's budget, and no other
// user's. One bucket per tenant and user with a bucket not full; full ones
// are forgotten by sweep.
type readBudgets struct {
	perSecond rate.Limit
	burst     int

	mu      sync.Mutex
	buckets map[key]*rate.Limiter
}

func (b *readBudgets) init(perSecond float64, burst int) {
	b.perSecond, b.burst = rate.Limit(perSecond), burst
	b.buckets = make(map[key]*rate.Limiter)
}

// take takes one read for the user and reports whether it got it; when
// not, wait is how long until the next one is allowed.
func (b *readBudgets) take(k key, now time.Time) (ok bool, wait time.Duration) {
	b.mu.Lock()
	defer b.mu.Unlock()
	lim := b.buckets[k]
	if lim == nil {
		lim = rate.NewLimiter(b.perSecond, b.burst)
		b.buckets[k] = lim
	}
	r := lim.ReserveN(now, 1)
	if wait = r.DelayFrom(now); wait > 0 {
		r.CancelAt(now) // a refused read takes nothing from the bucket
		return false, wait
	}
	return true, 0
}

// sweep forgets the buckets that have refilled: they are as a new one.
func (b *readBudgets) sweep(now time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for k, lim := range b.buckets {
		if lim.TokensAt(now) >= float64(b.burst) {
			delete(b.buckets, k)
		}
	}
}
