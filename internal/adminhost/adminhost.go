// Package adminhost keeps the operator listeners (admin, debug) from
// answering a browser that DNS rebinding pointed at them: such a page
// reaches the listener under its own DNS name, which its Host header
// carries, so a listener that answers only to its own names (IP literals,
// localhost and the names an operator lists) never serves it.
package adminhost

import (
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strings"

	"github.com/pushd/pushd/internal/httperr"
)

// Handler serves next only requests whose Host is one of the listener's
// own names (Allowed); any other gets 403 host_not_allowed, on every path.
// names are the DNS names besides localhost it answers to; nil means none.
func Handler(next http.Handler, names []string) http.Handler {
	own := make([]string, 0, len(names))
	for _, n := range names {
		if n = canonical(n); n != "" {
			own = append(own, n)
		}
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !Allowed(r.Host, own) {
			httperr.Write(w, http.StatusForbidden, httperr.HostNotAllowed,
				"this listener answers only to an IP address, localhost or a name in --admin-hosts in the Host header")
			return
		}
		next.ServeHTTP(w, r)
	})
}

// Allowed reports whether host, a Host header with or without a port, is
// one of the listener's own names: an IP literal (a rebinding page always
// uses a DNS name, and Prometheus scrapes pod addresses), localhost, or
// one of names, which Handler has made canonical. An empty Host is
// nobody's name.
func Allowed(host string, names []string) bool {
	h := host
	if name, _, err := net.SplitHostPort(host); err == nil {
		h = name
	} else if strings.HasPrefix(h, "[") && strings.HasSuffix(h, "]") {
		h = h[1 : len(h)-1]
	}
	if _, err := netip.ParseAddr(h); err == nil {
		return true
	}
	h = canonical(h)
	if h == "" {
		return false
	}
	return h == "localhost" || slices.Contains(names, h)
}

// canonical is a DNS name as Allowed compares it: lower case, without the
// root's trailing dot.
func canonical(name string) string {
	return strings.ToLower(strings.TrimSuffix(strings.TrimSpace(name), "."))
}
