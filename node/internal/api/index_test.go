package api_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/pushd/pushd/node/internal/api"
)

// GET / says what the node is and where to go; the demo is named only
// when it is served. HEAD answers alike, without the body.
func TestIndexNamesTheServiceAndItsEndpoints(t *testing.T) {
	demo := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("demo")) })
	for _, tc := range []struct {
		name     string
		edit     func(*api.Config)
		version  string
		wantDemo string
	}{
		{"without the demo", nil, "(devel)", ""},
		{"with the demo", func(c *api.Config) { c.Demo, c.Version = demo, "v1.2.3" }, "v1.2.3", "/demo/"},
	} {
		n := newNode(t, tc.edit)
		r := do(t, n.url, req{method: http.MethodGet, path: "/"})
		if r.status != http.StatusOK || !strings.HasPrefix(r.header.Get("Content-Type"), "application/json") {
			t.Fatalf("%s: GET / %d %q (%s), want 200 JSON", tc.name, r.status, r.body, r.header.Get("Content-Type"))
		}
		var got map[string]string
		if err := json.Unmarshal(r.body, &got); err != nil {
			t.Fatalf("%s: GET / body %q: %v", tc.name, r.body, err)
		}
		want := map[string]string{"service": "pushd", "version": tc.version, "docs": "docs/PROTOCOL.md in the repository",
			"health": "/healthz", "events": "/v1/events"}
		if tc.wantDemo != "" {
			want["demo"] = tc.wantDemo
		}
		if len(got) != len(want) {
			t.Fatalf("%s: GET / %v, want %v", tc.name, got, want)
		}
		for k, v := range want {
			if got[k] != v {
				t.Fatalf("%s: GET / %v, want %v", tc.name, got, want)
			}
		}
		head := do(t, n.url, req{method: http.MethodHead, path: "/"})
		if head.status != http.StatusOK || len(head.body) != 0 || !strings.HasPrefix(head.header.Get("Content-Type"), "application/json") {
			t.Fatalf("%s: HEAD / %d %q (%s), want 200 JSON without a body", tc.name, head.status, head.body, head.header.Get("Content-Type"))
		}
		wantError(t, tc.name+": GET /nowhere", do(t, n.url, req{method: http.MethodGet, path: "/nowhere"}), 404, "not_found")
		if tc.wantDemo != "" {
			if r := do(t, n.url, req{method: http.MethodGet, path: "/demo/"}); r.status != http.StatusOK || string(r.body) != "demo" {
				t.Fatalf("%s: GET /demo/ %d %q, want the demo", tc.name, r.status, r.body)
			}
		}
	}
}
