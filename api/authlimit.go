package api

import (
	"sync"
	"time"

	"github.com/hashicorp/golang-lru/v2/simplelru"
	"github.com/labstack/echo/v4"
	"golang.org/x/time/rate"

	"github.com/pushd/pushd/internal/httperr"
)

// defaultAuthFailureAddresses bounds the addresses tracked when
// Config.AuthFailureAddresses is zero.
const defaultAuthFailureAddresses = 1 << 16

// authFailures limits failed authentications per client address with a
// token bucket each, so that a flood of made-up tokens costs a session
// lookup (a PostgreSQL query) only for its first few. The buckets are the
// most recently used addresses'; forgetting one only gives its address a
// fresh burst. A nil *authFailures limits nothing.
type authFailures struct {
	burst int
	rate  rate.Limit

	mu      sync.Mutex // guards buckets: simplelru is not safe for concurrent use
	buckets *simplelru.LRU[string, *rate.Limiter]
}

func newAuthFailures(burst int, perSecond float64, addresses int) *authFailures {
	if burst <= 0 || perSecond <= 0 {
		return nil
	}
	if addresses <= 0 {
		addresses = defaultAuthFailureAddresses
	}
	buckets, _ := simplelru.NewLRU[string, *rate.Limiter](addresses, nil) // errs only on a size <= 0
	return &authFailures{burst: burst, rate: rate.Limit(perSecond), buckets: buckets}
}

// authAttempt is one authentication counted against its address's bucket.
type authAttempt struct{ r *rate.Reservation }

// begin takes one failure from addr's bucket before a token is checked,
// or, when the bucket is empty, says how long until it has one. Taking it
// first, rather than after a failure, lets only as many checks run at once
// as the bucket holds: a burst of parallel requests cannot all slip in on
// the last token.
func (f *authFailures) begin(addr string) (authAttempt, time.Duration) {
	if f == nil {
		return authAttempt{}, 0
	}
	f.mu.Lock()
	lim, ok := f.buckets.Get(addr)
	if !ok {
		lim = rate.NewLimiter(f.rate, f.burst)
		f.buckets.Add(addr, lim)
	}
	f.mu.Unlock()
	now := time.Now()
	r := lim.ReserveN(now, 1)
	if wait := r.DelayFrom(now); wait > 0 {
		r.CancelAt(now)
		return authAttempt{}, wait
	}
	return authAttempt{r: r}, 0
}

// end gives the failure back unless the check failed.
func (a authAttempt) end(failed bool) {
	if a.r != nil && !failed {
		a.r.Cancel()
	}
}

// tooManyFailures answers 429 like every other rate limit.
func tooManyFailures(c echo.Context, wait time.Duration) error {
	return writeRateLimited(c, wait, httperr.RateLimited, "too many failed authentications from this address; retry later")
}
