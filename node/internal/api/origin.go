package api

import (
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"github.com/labstack/echo/v4"

	"github.com/pushd/pushd/internal/httperr"
)

// OriginNotAllowed is the error code of a request refused for its Origin
// (403).
const OriginNotAllowed = "origin_not_allowed"

// checkOrigin refuses, before the limits, authentication and admission
// spend anything on it, a request that a page of a foreign origin made: one
// with an Origin header that is neither the request's own host nor matched
// by OriginPatterns. Which requests are checked:
//
//   - A stream no CORS protects (noCORS: a WebSocket, whose every frame
//     the page reads), whatever carries its token.
//   - Any other request (the SSE stream, the snapshot API) only when it
//     carries the token cookie: the browser adds it to a foreign page's
//     request on its own, while a token in Authorization or access_token
//     is one the page was given, and CORS decides whether it may read the
//     answer.
//
// A request without Origin is not checked: non-browser clients send none,
// nor do browsers on a same-origin GET.
func (s *server) checkOrigin(noCORS bool, next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		r := c.Request()
		origin := r.Header.Get("Origin")
		if origin == "" || (!noCORS && !s.carriesCookie(r)) || s.sameOrAllowedOrigin(r, origin) {
			return next(c)
		}
		what := "use the token cookie here"
		if noCORS {
			what = "connect to " + c.Path() + " here"
		}
		return fail(http.StatusForbidden, OriginNotAllowed,
			"pages of origin "+httperr.Truncate(strconv.Quote(origin), 80)+" may not "+what+"; allowed are the server's own host and --allowed-origins")
	}
}

// carriesCookie reports whether r has the cookie authentication reads a
// token from, with a value (an empty one is no credential).
func (s *server) carriesCookie(r *http.Request) bool {
	ck, err := r.Cookie(s.cfg.Auth.CookieName())
	return err == nil && ck.Value != ""
}

// sameOrAllowedOrigin is the WebSocket library's origin rule, which the
// upgrade applies again: the request's own host, or a listed pattern.
func (s *server) sameOrAllowedOrigin(r *http.Request, origin string) bool {
	if u, err := url.Parse(origin); err == nil && u.Host != "" && strings.EqualFold(u.Host, r.Host) {
		return true
	}
	return originAllowed(s.cfg.OriginPatterns, origin)
}
