package api

import (
	"net/http"
	"strconv"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/pushd/pushd/admission"
	"github.com/pushd/pushd/internal/httperr"
)

// Node-local limits, checked before authentication so that a flood of
// connections costs no token checks and no Redis round trips. Counts come
// from the hub, which every open stream is registered with; requests in
// flight between the check and the hub's Open can overshoot a limit by
// their number, which is bounded by the listener's backlog.

// overCapacityRetry is what a client refused for capacity is told to wait:
// long enough for a load balancer to try another node first.
const overCapacityRetry = 5 * time.Second

// limitStreams refuses a new stream when the node holds MaxConns
// connections (503: the node is full, another may not be) or the client's
// address holds MaxConnsPerIP of them (429).
func (s *server) limitStreams(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		if max := s.cfg.MaxConns; max > 0 && s.cfg.Hub.Len() >= max {
			return &apiError{status: http.StatusServiceUnavailable, code: httperr.OverCapacity, wait: overCapacityRetry,
				message: "this node holds its maximum of " + strconv.Itoa(max) + " connections; retry, possibly on another node"}
		}
		if max := s.cfg.MaxConnsPerIP; max > 0 {
			if s.cfg.Hub.ConnsFrom(c.RealIP()) >= max {
				s.cfg.Admission.Refused(admission.EndpointConnect, admission.RuleConnsPerIP, overCapacityRetry)
				return tooManyRequests(httperr.TooManyConnections, overCapacityRetry,
					"at most "+strconv.Itoa(max)+" open connections per client address on this node")
			}
			s.cfg.Admission.Passed(admission.EndpointConnect, admission.RuleConnsPerIP)
		}
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
