package api

import (
	"net/http"
	"strconv"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/pushd/pushd/admission"
	"github.com/pushd/pushd/hub"
	"github.com/pushd/pushd/internal/httperr"
)

// Node-local limits, checked before authentication so that a flood of
// connections costs no token checks and no Redis round trips. A request
// that passes reserves its place (hub.Slot) at once, so requests in flight
// count as the streams they may become: N at once against a cap of C hold
// at most C.

// overCapacityRetry is what a client refused for capacity is told to wait:
// long enough for a load balancer to try another node first.
const overCapacityRetry = 5 * time.Second

// slotKey is where limitStreams leaves the request's reserved slot for
// admitStream, which hands it to the hub.
const slotKey = "pushd.slot"

// limitStreams reserves a new stream's place, or refuses it when the node
// holds MaxConns connections (503: the node is full, another may not be)
// or the client's address holds MaxConnsPerIP of them (429), those still
// being set up included. A place the hub never opened a connection in
// (the request refused later, or its upgrade failed) is given back when
// the request ends.
func (s *server) limitStreams(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		slot, limit := s.cfg.Hub.Reserve(c.RealIP(), s.cfg.MaxConns, s.cfg.MaxConnsPerIP)
		switch limit {
		case hub.SlotNode:
			return &apiError{status: http.StatusServiceUnavailable, code: httperr.OverCapacity, wait: overCapacityRetry,
				message: "this node holds its maximum of " + strconv.Itoa(s.cfg.MaxConns) + " connections; retry, possibly on another node"}
		case hub.SlotAddress:
			s.cfg.Admission.Refused(admission.EndpointConnect, admission.RuleConnsPerIP, overCapacityRetry)
			return tooManyRequests(httperr.TooManyConnections, overCapacityRetry,
				"at most "+strconv.Itoa(s.cfg.MaxConnsPerIP)+" open connections per client address on this node")
		}
		if s.cfg.MaxConnsPerIP > 0 {
			s.cfg.Admission.Passed(admission.EndpointConnect, admission.RuleConnsPerIP)
		}
		defer slot.Release() // a no-op once the hub opened the connection
		c.Set(slotKey, slot)
		return next(c)
	}
}

// limitURL answers 414 with a JSON body for a request line longer than
// MaxURLBytes. Longer still, past the server's header limit, net/http
// answers 431 itself before any handler runs.
func (s *server) limitURL(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		if n := len(c.Request().RequestURI); n > s.cfg.MaxURLBytes {
			return fail(http.StatusRequestURITooLong, httperr.URITooLong,
				"the URL is "+strconv.Itoa(n)+" bytes; at most "+strconv.Itoa(s.cfg.MaxURLBytes))
		}
		return next(c)
	}
}
