package api

import (
	"net/http"

	"github.com/labstack/echo/v4"

	"github.com/pushd/pushd/admission"
	"github.com/pushd/pushd/auth"
	"github.com/pushd/pushd/hub"
	"github.com/pushd/pushd/internal/httperr"
)

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
		p.RemoteIP = c.RealIP()
		p.Slot, _ = c.Get(slotKey).(*hub.Slot)
		if s.cfg.Admission == nil {
			serve(c.Response(), c.Request(), p)
			return nil
		}
		hold, d := s.cfg.Admission.Connect(c.Request().Context(), p.TenantID, p.UserID, c.RealIP(), authPrincipal(c).Session)
		if !d.Allowed {
			return refuse(d)
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
		if a := s.cfg.Admission; a != nil {
			ctx := c.Request().Context()
			if c.Request().Header.Get(PollHeader) != "" && a.Poll(ctx, p.TenantID, p.UserID) {
				return h(c, p)
			}
			if d := a.API(ctx, p.TenantID, authPrincipal(c).Plan, endpoint); !d.Allowed {
				return refuse(d)
			}
		}
		return h(c, p)
	}
}

// PollHeader marks a snapshot read as a fallback poll: a client that
// cannot hold a stream reading what it watches (docs/PROTOCOL.md). Within
// the user's poll bucket it costs the tenant's API window nothing.
const PollHeader = "X-Pushd-Poll"

// refuse is the 429 of a refused decision: its wait, and the rule that
// refused in the message. A connection refused by a fleet-wide cap on open connections
// (per user or per tenant) is told too_many_connections: a slot frees when
// one of the user's (or tenant's) other connections closes. It comes with
// 429 and a wait, like a rate limit, because clients treat both alike:
// back off for Retry-After and try again.
func refuse(d admission.Decision) error {
	switch d.Rule {
	case admission.RuleUserCap:
		return tooManyRequests(httperr.TooManyConnections, d.RetryAfter, "too many open connections for this user")
	case admission.RuleTenantCap:
		return tooManyRequests(httperr.TooManyConnections, d.RetryAfter, "too many open connections for this tenant")
	}
	return tooManyRequests(httperr.RateLimitExceeded, d.RetryAfter, "rate limited ("+d.Rule+"); retry later")
}
