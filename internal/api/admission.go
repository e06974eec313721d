package api

import (
	"encoding/json"
	"net/http"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/pushd/pushd/admission"
	"github.com/pushd/pushd/auth"
	"github.com/pushd/pushd/hub"
	"github.com/pushd/pushd/internal/httperr"
)

// TooManyConnections is the error code of a connection refused by a
// fleet-wide cap on open connections (per user or per tenant). It comes with
// 429, like a rate limit, because clients treat both alike: back off for
// Retry-After and try again. A slot frees when one of the user's (or
// tenant's) other connections closes.
const TooManyConnections = "too_many_connections"

// principalKey is where authed leaves the authenticated principal for the
// admission checks, which need its plan and session.
const principalKey = "pushd.principal"

func authPrincipal(c echo.Context) auth.Principal {
	p, _ := c.Get(principalKey).(auth.Principal)
	return p
}

// admitStream checks a new stream against the connect buckets and the
// connection caps before the transport answers, so a refused client gets a
// plain 429 rather than a stream that ends at once. The admitted
// connection's lease travels in the principal to the hub, which releases it
// when the connection closes; one the transport never handed to the hub
// (a bad request, a refused upgrade, a draining node) is released here.
func (s *server) admitStream(serve func(http.ResponseWriter, *http.Request, hub.Principal)) func(echo.Context, hub.Principal) error {
	return func(c echo.Context, p hub.Principal) error {
		p.RemoteIP = c.RealIP() // counted by the hub for limitStreams
		if s.cfg.Admission == nil {
			serve(c.Response(), c.Request(), p)
			return nil
		}
		hold, d := s.cfg.Admission.Connect(c.Request().Context(), p.TenantID, p.UserID, c.RealIP(), authPrincipal(c).Session)
		if !d.Allowed {
			return refuse(c, d)
		}
		p.Hold = hold
		serve(c.Response(), c.Request(), p)
		if !hold.Attached() {
			hold.Release()
		}
		return nil
	}
}

// limitAPI checks a snapshot API call against the tenant's plan; endpoint
// names the window.
func (s *server) limitAPI(endpoint string, h func(echo.Context, hub.Principal) error) func(echo.Context, hub.Principal) error {
	return func(c echo.Context, p hub.Principal) error {
		if s.cfg.Admission != nil {
			if d := s.cfg.Admission.API(c.Request().Context(), p.TenantID, authPrincipal(c).Plan, endpoint); !d.Allowed {
				return refuse(c, d)
			}
		}
		return h(c, p)
	}
}

// rateLimitBody is the error body of a 429: the JSON error of every
// endpoint plus the wait in milliseconds, finer than Retry-After's seconds.
type rateLimitBody struct {
	Error        string `json:"error"`
	RetryAfterMS int64  `json:"retry_after_ms"`
	Message      string `json:"message"`
}

// refuse answers 429 with Retry-After (whole seconds, rounded up) and the
// rule that refused in the message.
func refuse(c echo.Context, d admission.Decision) error {
	switch d.Rule {
	case admission.RuleUserCap:
		return writeRateLimited(c, d.RetryAfter, TooManyConnections, "too many open connections for this user")
	case admission.RuleTenantCap:
		return writeRateLimited(c, d.RetryAfter, TooManyConnections, "too many open connections for this tenant")
	}
	return writeRateLimited(c, d.RetryAfter, httperr.RateLimited, "rate limited ("+d.Rule+"); retry later")
}

// writeRateLimited answers 429 with Retry-After and a rateLimitBody; the
// wait is at least a millisecond and rounded up to one.
func writeRateLimited(c echo.Context, wait time.Duration, code, message string) error {
	wait = max(wait, time.Millisecond)
	body := rateLimitBody{Error: code, RetryAfterMS: wait.Milliseconds(), Message: message}
	if wait%time.Millisecond != 0 {
		body.RetryAfterMS++
	}
	w := c.Response()
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Cache-Control", "no-store")
	httperr.RetryAfter(w, wait)
	w.WriteHeader(http.StatusTooManyRequests)
	return json.NewEncoder(w).Encode(body)
}
