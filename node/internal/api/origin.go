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
// spend anything on it, a request that a page of a foreign origin made.
// Which requests are checked:
//
//   - A stream no CORS protects (noCORS: a WebSocket, whose every frame
//     the page reads), whatever carries its token: its Origin must be the
//     request's own host or matched by OriginPatterns.
//   - Any other request (the SSE stream, the snapshot API) only when it
//     carries the token cookie: the browser adds it to a foreign page's
//     request on its own, while a token in Authorization or access_token
//     is one the page was given, and CORS decides whether it may read the
//     answer. Its Origin must be allowed as above; without one, a browser
//     that marks it Sec-Fetch-Site cross-site or same-site made it for a
//     page of another origin without CORS (an <img>, a <script>, a link
//     followed), which no page of an allowed origin needs: refused too.
//
// A request without Origin and without that mark is not checked:
// non-browser clients send neither, nor do browsers on a same-origin GET.
func (s *server) checkOrigin(noCORS bool, next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		r := c.Request()
		origin := r.Header.Get("Origin")
		switch {
		case !noCORS && !s.carriesCookie(r):
			return next(c)
		case origin == "" && (noCORS || !crossOrigin(r)):
			return next(c)
		case origin == "":
			return fail(http.StatusForbidden, OriginNotAllowed,
				"a page of another origin may not use the token cookie here without CORS (Sec-Fetch-Site: "+
					httperr.Truncate(strconv.Quote(r.Header.Get("Sec-Fetch-Site")), 40)+"); send the token in Authorization, or the request with CORS from an allowed origin")
		case s.sameOrAllowedOrigin(r, origin):
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

// crossOrigin reports whether the browser marked r as made for a page of
// another origin (Fetch Metadata): cross-site, or same-site but of
// another origin (a sibling subdomain). Browsers without Fetch Metadata
// send no mark; the cookie's SameSite attribute guards them.
func crossOrigin(r *http.Request) bool {
	switch r.Header.Get("Sec-Fetch-Site") {
	case "cross-site", "same-site":
		return true
	}
	return false
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
	return sameHost(r, origin) || originAllowed(s.cfg.OriginPatterns, origin)
}

// sameHost reports whether origin is of r's own host: a page the node
// itself served.
func sameHost(r *http.Request, origin string) bool {
	u, err := url.Parse(origin)
	return err == nil && u.Host != "" && strings.EqualFold(u.Host, r.Host)
}

// UnsupportedMediaType is the error code of a publish without an API key
// whose body is not declared JSON (415).
const UnsupportedMediaType = "unsupported_media_type"

// checkNotFromPage refuses a publish without an API key that a web page
// could have sent: any page open in a browser on a loopback host reaches a
// loopback address. A page of another origin sends a simple request
// without asking (no preflight) only with a simple content type, and a
// browser marks what a page sends with Origin and Fetch Metadata; a
// client that is no browser sends JSON and neither mark. With a key, the
// key is the guard: a page cannot set X-API-Key without a preflight,
// which publishing never answers.
func checkNotFromPage(r *http.Request) error {
	if o := r.Header.Get("Origin"); o != "" {
		if !sameHost(r, o) {
			return fail(http.StatusForbidden, OriginNotAllowed, "a page of origin "+httperr.Truncate(strconv.Quote(o), 80)+" may not publish")
		}
	}
	if crossOrigin(r) {
		return fail(http.StatusForbidden, OriginNotAllowed, "a page of another origin may not publish")
	}
	if corsSimpleType(r.Header.Get("Content-Type")) {
		return fail(http.StatusUnsupportedMediaType, UnsupportedMediaType,
			"publishing without an API key takes a JSON body (Content-Type: application/json, or none), which no page of another origin can send without asking")
	}
	return nil
}

// corsSimpleType reports whether a page of any origin may send a body of
// content type ct without a preflight: its essence, the part before any
// parameter, as a browser's lenient parser reads it.
func corsSimpleType(ct string) bool {
	mt, _, _ := strings.Cut(ct, ";")
	switch strings.ToLower(strings.TrimSpace(mt)) {
	case "text/plain", "application/x-www-form-urlencoded", "multipart/form-data":
		return true
	}
	return false
}
