package api

import (
	"context"
	"errors"
	"net/http"
	"sync"
	"time"

	"github.com/hashicorp/golang-lru/v2/simplelru"
	"github.com/labstack/echo/v4"
	"golang.org/x/time/rate"

	"github.com/pushd/pushd/auth"
	"github.com/pushd/pushd/internal/httperr"
)

// AuthLimit limits failed authentications per client address with a
// token bucket each, so that a flood of made-up tokens costs a session
// lookup (a PostgreSQL query) only for its first few. A node makes one,
// and every path that checks a client's token takes from it: the API's
// endpoints (Config.AuthLimit), the demo's, and a WebSocket refresh
// (Check), so that no path spends an address's allowance apart. The
// buckets are the most recently used addresses'; forgetting one only gives
// its address a fresh burst. A nil *AuthLimit limits nothing. What counts
// as failed is failed's to say.
type AuthLimit struct {
	burst int
	rate  rate.Limit

	mu      sync.Mutex // guards buckets and every bucket: simplelru is not safe for concurrent use
	buckets *simplelru.LRU[string, *failureBucket]
}

// failureBucket is one address's bucket and its checks in flight, each of
// which may yet fail and take a token.
type failureBucket struct {
	lim      *rate.Limiter
	inFlight int
}

// NewAuthLimit returns the buckets of c's AuthFailureBurst,
// AuthFailureRate and AuthFailureAddresses; nil when c sets no limit.
func NewAuthLimit(c Config) *AuthLimit {
	c = c.WithDefaults()
	if c.AuthFailureBurst <= 0 || c.AuthFailureRate <= 0 {
		return nil
	}
	buckets, _ := simplelru.NewLRU[string, *failureBucket](c.AuthFailureAddresses, nil) // errs only on a size <= 0
	return &AuthLimit{burst: c.AuthFailureBurst, rate: rate.Limit(c.AuthFailureRate), buckets: buckets}
}

// Check verifies token for the client at addr as the API checks a
// request's. While addr's bucket is empty the token is not checked, and
// wait says how long until it may be; a check that failed takes a token.
func (l *AuthLimit) Check(ctx context.Context, v *auth.Verifier, addr, token string) (p auth.Principal, wait time.Duration, err error) {
	attempt, wait := l.begin(addr)
	if wait > 0 {
		return auth.Principal{}, wait, nil
	}
	p, err = v.AuthenticateToken(ctx, token)
	attempt.end(failed(err))
	return p, 0, err
}

// authAttempt is one authentication counted against its address's bucket.
type authAttempt struct {
	f *AuthLimit
	b *failureBucket
}

// begin admits one check of addr's token, or, when its bucket holds no
// token that a check in flight may not yet take, says how long until it
// does. Counting the checks in flight against the bucket lets only as many
// run at once as could fail: a burst of parallel requests cannot all slip
// in on the last token. Only a failed check takes its token (end).
func (f *AuthLimit) begin(addr string) (authAttempt, time.Duration) {
	if f == nil {
		return authAttempt{}, 0
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	b, ok := f.buckets.Get(addr)
	if !ok {
		b = &failureBucket{lim: rate.NewLimiter(f.rate, f.burst)}
		f.buckets.Add(addr, b)
	}
	now := time.Now()
	if free := b.lim.TokensAt(now) - float64(b.inFlight); free < 1 {
		return authAttempt{}, time.Duration((1 - free) / float64(f.rate) * float64(time.Second))
	}
	b.inFlight++
	return authAttempt{f, b}, 0
}

// end closes the check; a failed one takes its token from the bucket.
func (a authAttempt) end(failed bool) {
	if a.b == nil {
		return
	}
	a.f.mu.Lock()
	defer a.f.mu.Unlock()
	a.b.inFlight--
	if failed {
		a.b.lim.AllowN(time.Now(), 1)
	}
}

// limitDemoAuth counts the demo's authentications against the client
// address's bucket, as authed counts the API's: the demo checks a request's
// bearer token itself, a session token with a lookup, and answers 401 when
// the check fails, which takes a token (an expired one too: the demo does
// not tell it apart by status).
func (s *server) limitDemoAuth(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		if c.Request().Header.Get("Authorization") == "" {
			return next(c)
		}
		attempt, wait := s.failures.begin(c.RealIP())
		if wait > 0 {
			return tooManyFailures(wait)
		}
		err := next(c)
		attempt.end(c.Response().Status == http.StatusUnauthorized)
		return err
	}
}

// tooManyFailures answers 429 like every other rate limit.
func tooManyFailures(wait time.Duration) error {
	return tooManyRequests(httperr.RateLimitExceeded, wait, "too many failed authentications from this address; retry later")
}

// failed reports whether a check's error takes a token from its address's
// bucket: an invalid token, and a session token the session store could
// not look up (auth.ErrUnavailable). A failed lookup costs the store what
// an unknown token costs it, more when the store is struggling, and an
// address sending made-up session tokens while PostgreSQL fails (a
// missing sessions table, an outage) would otherwise reach it once per
// request. Honest clients lose little by it: the 503 already tells them
// to wait (Retry-After), their bucket refills at the configured rate, and
// a session Redis holds is looked up without PostgreSQL at all. An
// expired token is no failure: it was signed by the issuer, and its
// client must hear token_expired to fetch a fresh one; nor is a missing
// one, which costs no lookup.
func failed(err error) bool {
	return errors.Is(err, auth.ErrInvalidToken) || errors.Is(err, auth.ErrUnavailable)
}
