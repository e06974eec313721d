package api

import (
	"net/http"
	"net/url"
	"path"
	"strings"

	"github.com/labstack/echo/v4"
	"github.com/labstack/echo/v4/middleware"
)

// cors lets pages of the listed origins read the streams and the snapshot
// API, with credentials (the pushd_token cookie), and nobody else: an
// unlisted origin gets no Access-Control-Allow-Origin, so its page cannot
// read a response even when the browser sent the cookie. Publishing is
// server to server and gets no CORS at all.
func cors(patterns []string) echo.MiddlewareFunc {
	return middleware.CORSWithConfig(middleware.CORSConfig{
		Skipper: func(c echo.Context) bool {
			p := c.Request().URL.Path
			return len(patterns) == 0 || !strings.HasPrefix(p, "/v1/") || p == "/v1/publish"
		},
		AllowOriginFunc:  func(origin string) (bool, error) { return originAllowed(patterns, origin), nil },
		AllowMethods:     []string{http.MethodGet, http.MethodHead},
		AllowHeaders:     []string{"Authorization", "Last-Event-ID", "If-None-Match", PollHeader},
		ExposeHeaders:    []string{"ETag", "Retry-After"},
		AllowCredentials: true,
		MaxAge:           600,
	})
}

// originAllowed matches an Origin header the way the WebSocket endpoint
// does (coder/websocket's OriginPatterns): a pattern with a scheme is
// matched against scheme://host, one without against the host, both with
// path.Match and case-insensitively. A pattern that does not parse
// matches nothing, nor does an origin without a host ("null").
func originAllowed(patterns []string, origin string) bool {
	u, err := url.Parse(origin)
	if err != nil || u.Host == "" {
		return false
	}
	for _, p := range patterns {
		target := u.Host
		if strings.Contains(p, "://") {
			target = u.Scheme + "://" + u.Host
		}
		if ok, err := path.Match(strings.ToLower(p), strings.ToLower(target)); err == nil && ok {
			return true
		}
	}
	return false
}
