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

// take takes n reads for the user and reports how many it got; when short,
// wait is how long until the next read is allowed.
func (b *readBudgets) take(k key, n int, now time.Time) (got int, wait time.Duration) {
	b.mu.Lock()
	defer b.mu.Unlock()
	lim := b.buckets[k]
	if lim == nil {
		lim = rate.NewLimiter(b.perSecond, b.burst)
		b.buckets[k] = lim
	}
	got = min(n, int(lim.TokensAt(now)))
	if got > 0 {
		lim.AllowN(now, got)
	}
	if got < n {
		r := lim.ReserveN(now, 1)
		wait = r.DelayFrom(now)
		r.CancelAt(now)
	}
	return got, wait
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
