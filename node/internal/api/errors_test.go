package api_test

import (
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pushd/pushd/auth"
	"github.com/pushd/pushd/auth/session"
	"github.com/pushd/pushd/fanout"
	"github.com/pushd/pushd/hub"
	"github.com/pushd/pushd/internal/testenv"
	"github.com/pushd/pushd/node/internal/api"
	"github.com/pushd/pushd/snapshot"
	"github.com/pushd/pushd/snapshot/store"
	"github.com/pushd/pushd/sse"
	"github.com/pushd/pushd/ws"
)

const testKey = "key"

// node is an api handler wired as a node wires it, on the shared Redis
// (no PostgreSQL: a Redis miss is "no such task"), with an HTTP server in
// front.
type node struct {
	url    string
	h      http.Handler
	rd     testenv.Redis
	signer *auth.Signer
}

// newNode starts one; edit changes the Config before New.
func newNode(t *testing.T, edit func(*api.Config)) *node {
	t.Helper()
	rd := testenv.SharedRedis(t)
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	store := store.New(store.Config{Redis: rd.Client, Names: rd.Names, Logger: quiet})
	t.Cleanup(store.Close)
	bus := fanout.NewMemoryBus()
	h := hub.New(hub.Config{Source: store, Bus: bus, Logger: quiet})
	bus.Start(h)
	wsh := ws.New(ws.Config{Hub: h, Logger: quiet})
	t.Cleanup(wsh.Close) // cleanups run last first: after the hub's Close
	sseh := sse.New(sse.Config{Hub: h, Logger: quiet})
	t.Cleanup(sseh.Close)
	t.Cleanup(h.Close)
	t.Cleanup(func() { bus.Close() })
	secret := auth.RandomSecret()
	v, err := auth.New(auth.Config{Secret: secret, Sessions: session.New(session.Config{Redis: rd.Client, Prefix: rd.Names.Prefix})})
	if err != nil {
		t.Fatal(err)
	}
	cfg := api.Config{
		Hub: h, Source: store, Publisher: fanout.NewRedisPublisher(rd.Client, rd.Names),
		Auth: v, APIKey: testKey,
		Streams:    []api.Stream{{Path: sse.Path, Transport: sseh}, {Path: ws.Path, Transport: wsh, NoCORS: true}},
		DemoSigner: auth.NewSigner(secret),
		Logger:     quiet,
	}
	if edit != nil {
		edit(&cfg)
	}
	handler := api.New(cfg)
	srv := httptest.NewServer(handler)
	t.Cleanup(srv.Close)
	return &node{url: srv.URL, h: handler, rd: rd, signer: auth.NewSigner(secret)}
}

// token signs a token of tenant t1 expiring at exp.
func (n *node) token(t *testing.T, exp time.Time) string {
	t.Helper()
	tok, err := n.signer.Sign(auth.Principal{TenantID: "t1", UserID: "u1", ExpiresAt: exp})
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

func bearer(tok string) map[string]string { return map[string]string{"Authorization": "Bearer " + tok} }

// deadRedis is a client of a port nothing listens on: every command fails
// at once with a refused connection.
func deadRedis(t *testing.T) *redis.Client {
	c := redis.NewClient(&redis.Options{
		Addr: "127.0.0.1:" + strconv.Itoa(testenv.FreePort(t)), MaxRetries: -1,
		DialerRetries: 1, DialerRetryTimeout: time.Millisecond, // a refused dial is final
	})
	t.Cleanup(func() { c.Close() })
	return c
}

// Unknown paths are 404 and known paths with another method 405 with the
// methods they take in Allow, each with a JSON error.
func TestRoutingErrors(t *testing.T) {
	n := newNode(t, nil)
	for _, tc := range []struct {
		method, path string
		status       int
		allow        string // a method Allow must list on a 405
	}{
		{"GET", "/nowhere", 404, ""},
		{"GET", "/v1/", 404, ""},
		{"GET", "/v1/projects/a/b/tasks", 404, ""},
		{"POST", "/v2/publish", 404, ""},
		{"GET", "/demo/", 404, ""}, // no Demo handler configured
		{"GET", "/index.html", 404, ""},
		{"GET", "//", 404, ""},
		{"POST", "/", 405, "GET"},
		{"GET", "/v1/publish", 405, "POST"},
		{"PUT", "/v1/publish", 405, "POST"},
		{"DELETE", "/v1/publish", 405, "POST"},
		{"PATCH", "/v1/publish", 405, "POST"},
		{"POST", "/v1/tasks/task_1", 405, "GET"},
		{"DELETE", "/v1/tasks/task_1", 405, "GET"},
		{"POST", "/v1/tasks", 405, "GET"},
		{"PUT", "/v1/projects/p1/tasks", 405, "GET"},
		{"POST", "/v1/events", 405, "GET"},
		{"POST", "/v1/ws", 405, "GET"},
		{"POST", "/healthz", 405, "GET"},
		{"POST", "/readyz", 405, "GET"},
		{"POST", "/demo/token", 405, "GET"},
	} {
		name := tc.method + " " + tc.path
		r := do(t, n.url, req{method: tc.method, path: tc.path, header: map[string]string{"X-API-Key": testKey}})
		if tc.status == 404 {
			wantError(t, name, r, 404, "not_found")
			continue
		}
		wantError(t, name, r, 405, "method_not_allowed")
		allow := strings.Split(strings.ReplaceAll(r.header.Get("Allow"), " ", ""), ",")
		if !contains(allow, tc.allow) || contains(allow, tc.method) {
			t.Errorf("%s: Allow %q, want it to list %s and not %s", name, r.header.Get("Allow"), tc.allow, tc.method)
		}
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// POST /v1/publish refuses a body that is no snapshot with 400
// invalid_snapshot, one past snapshot.MaxSize with 413 too_large (and
// takes one of exactly MaxSize), a URL past MaxURLBytes with 414; none is
// stored. The Content-Type is not looked at.
func TestPublishBodyErrors(t *testing.T) {
	n := newNode(t, nil)
	key := map[string]string{"X-API-Key": testKey}
	// padded is a valid snapshot of task padded to size bytes.
	padded := func(task string, size int) string {
		d := doc(task, "t1", 1, `,"pad":""`)
		return d[:len(d)-2] + strings.Repeat("x", size-len(d)) + `"}`
	}
	tooBig := testenv.UniqueID("task")
	for _, tc := range []struct {
		name, task, body string
		status           int
		code             string
	}{
		{"empty", "", "", 400, "invalid_snapshot"},
		{"null", "", "null", 400, "invalid_snapshot"},
		{"an array", "", `[{"task_id":"a","tenant_id":"t1","version":1}]`, 400, "invalid_snapshot"},
		{"a number", "", "42", 400, "invalid_snapshot"},
		{"truncated", "", `{"task_id":"a",`, 400, "invalid_snapshot"},
		{"trailing data", "task_trailing", doc("task_trailing", "t1", 1, "") + `{}`, 400, "invalid_snapshot"},
		{"duplicate field", "task_dup", `{"task_id":"task_dup","tenant_id":"t1","version":1,"version":2}`, 400, "invalid_snapshot"},
		{"invalid UTF-8", "task_utf8", doc("task_utf8", "t1", 1, `,"x":"`+"\xff"+`"`), 400, "invalid_snapshot"},
		{"no task_id", "", `{"tenant_id":"t1","version":1}`, 400, "invalid_snapshot"},
		{"no tenant_id", "task_nt", `{"task_id":"task_nt","version":1}`, 400, "invalid_snapshot"},
		{"no version", "task_nv", `{"task_id":"task_nv","tenant_id":"t1"}`, 400, "invalid_snapshot"},
		{"version 0", "task_v0", doc("task_v0", "t1", 0, ""), 400, "invalid_snapshot"},
		{"negative version", "task_vn", doc("task_vn", "t1", -1, ""), 400, "invalid_snapshot"},
		{"version as a string", "task_vs", `{"task_id":"task_vs","tenant_id":"t1","version":"1"}`, 400, "invalid_snapshot"},
		{"fractional version", "task_vf", `{"task_id":"task_vf","tenant_id":"t1","version":1.5}`, 400, "invalid_snapshot"},
		{"bad task_id", "", doc("a b", "t1", 1, ""), 400, "invalid_snapshot"},
		{"bad tenant_id", "task_bt", doc("task_bt", "t/1", 1, ""), 400, "invalid_snapshot"},
		{"bad project_id", "task_bp", doc("task_bp", "t1", 1, `,"project_id":"p 1"`), 400, "invalid_snapshot"},
		{"one byte past MaxSize", tooBig, padded(tooBig, snapshot.MaxSize+1), 413, "too_large"},
	} {
		r := do(t, n.url, req{method: "POST", path: "/v1/publish", header: key, body: tc.body})
		wantError(t, tc.name, r, tc.status, tc.code)
		if tc.task != "" && stored(t, n.rd, tc.task) != nil {
			t.Errorf("%s: stored", tc.name)
		}
	}

	// Exactly MaxSize is taken, whatever the Content-Type says.
	task := testenv.UniqueID("task")
	r := do(t, n.url, req{method: "POST", path: "/v1/publish",
		header: map[string]string{"X-API-Key": testKey, "Content-Type": "text/plain"}, body: padded(task, snapshot.MaxSize)})
	if r.status != http.StatusOK || stored(t, n.rd, task) == nil {
		t.Errorf("a snapshot of exactly %d bytes: %d %q", snapshot.MaxSize, r.status, r.body)
	}

	// A body of unannounced length (chunked) is cut at the same size.
	pr, pw := io.Pipe()
	wrote := make(chan struct{})
	go func() {
		defer close(wrote)
		pw.Write([]byte(padded(tooBig, 2*snapshot.MaxSize))) // returns early once the pipe is closed below
		pw.Close()
	}()
	hr, _ := http.NewRequest(http.MethodPost, n.url+"/v1/publish", pr)
	hr.Header.Set("X-API-Key", testKey)
	resp, err := http.DefaultClient.Do(hr)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	pr.CloseWithError(io.ErrClosedPipe) // ends the writer if the client stopped reading the pipe
	<-wrote
	wantError(t, "chunked past MaxSize", reply{status: resp.StatusCode, header: resp.Header, body: b}, 413, "too_large")

	long := do(t, n.url, req{method: "POST", path: "/v1/publish?x=" + strings.Repeat("a", 9<<10), header: key, body: doc(testenv.UniqueID("task"), "t1", 1, "")})
	wantError(t, "URL past MaxURLBytes", long, 414, "uri_too_long")
}

// The read endpoints answer a request without a usable token 401 (and
// token_expired for an expired one) with WWW-Authenticate, a session
// store that cannot be asked 503, and malformed parameters 400, each with
// its JSON code; a snapshot source that does not answer is 503.
func TestReadEndpointErrors(t *testing.T) {
	n := newNode(t, func(c *api.Config) { c.MaxIDs = 3 })
	good := n.token(t, time.Now().Add(time.Hour))
	other, _ := auth.NewSigner(auth.RandomSecret()).Sign(auth.Principal{TenantID: "t1", UserID: "u1", ExpiresAt: time.Now().Add(time.Hour)})
	routes := []string{"/v1/tasks/task_1", "/v1/tasks?ids=task_1", "/v1/projects/p1/tasks", "/v1/events?task=task_1", "/v1/ws"}
	for _, path := range routes {
		for _, tc := range []struct {
			name   string
			header map[string]string
			code   string
		}{
			{"no token", nil, "unauthorized"},
			{"empty bearer", map[string]string{"Authorization": "Bearer "}, "unauthorized"},
			{"another scheme", map[string]string{"Authorization": "Basic " + good}, "unauthorized"},
			{"garbage", bearer("not.a.jwt"), "unauthorized"},
			{"another secret", bearer(other), "unauthorized"},
			{"unknown session", bearer("sess" + testenv.RandomSuffix(12)), "unauthorized"},
			{"empty cookie", map[string]string{"Cookie": auth.DefaultCookieName + "="}, "unauthorized"},
			{"expired", bearer(n.token(t, time.Now().Add(-time.Hour))), "token_expired"},
		} {
			r := do(t, n.url, req{method: "GET", path: path, header: tc.header})
			wantError(t, path+", "+tc.name, r, 401, tc.code)
			if !strings.HasPrefix(r.header.Get("WWW-Authenticate"), "Bearer") {
				t.Errorf("%s, %s: WWW-Authenticate %q", path, tc.name, r.header.Get("WWW-Authenticate"))
			}
		}
	}

	for _, tc := range []struct {
		path   string
		status int
		code   string
	}{
		{"/v1/tasks/task_absent", 404, "not_found"},
		{"/v1/tasks/bad%20id", 400, "invalid_id"},
		{"/v1/tasks/" + strings.Repeat("a", 200), 400, "invalid_id"},
		{"/v1/tasks/a/b", 400, "invalid_id"}, // the router's last parameter takes the slashes too
		{"/v1/projects//tasks", 400, "invalid_id"},
		{"/v1/tasks/task_1?verbose=1", 400, "unknown_parameter"},
		{"/v1/tasks", 400, "bad_request"},
		{"/v1/tasks?ids=", 400, "bad_request"},
		{"/v1/tasks?ids=a,,b", 400, "invalid_id"},
		{"/v1/tasks?ids=a,b%20c", 400, "invalid_id"},
		{"/v1/tasks?ids=a,b,c,d", 400, "too_many_ids"},
		{"/v1/tasks?ids=a&x=1", 400, "unknown_parameter"},
		{"/v1/projects/bad%20id/tasks", 400, "invalid_id"},
		{"/v1/projects/p1/tasks?ids=a", 400, "unknown_parameter"},
		{"/demo/token?tenant=bad%20id", 400, "invalid_id"},
		{"/demo/token?user=" + strings.Repeat("u", 200), 400, "invalid_id"},
		{"/demo/token?admin=1", 400, "unknown_parameter"},
	} {
		wantError(t, tc.path, do(t, n.url, req{method: "GET", path: tc.path, header: bearer(good)}), tc.status, tc.code)
	}

	// Neither the session store nor the snapshot source answers.
	dead := deadRedis(t)
	down := newNode(t, func(c *api.Config) {
		v, err := auth.New(auth.Config{Secret: auth.RandomSecret(), Sessions: session.New(session.Config{Redis: dead})})
		if err != nil {
			t.Fatal(err)
		}
		c.Auth = v
	})
	wantError(t, "session store down", do(t, down.url, req{method: "GET", path: "/v1/tasks/task_1", header: bearer("sess" + testenv.RandomSuffix(12))}), 503, "unavailable")
	noSource := newNode(t, func(c *api.Config) {
		c.Source = store.New(store.Config{Redis: dead, CacheTTL: -1, NegativeTTL: -1, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	})
	tok := noSource.token(t, time.Now().Add(time.Hour))
	for _, path := range []string{"/v1/tasks/task_1", "/v1/tasks?ids=task_1,task_2", "/v1/projects/p1/tasks"} {
		wantError(t, path+" with the source down", do(t, noSource.url, req{method: "GET", path: path, header: bearer(tok)}), 503, "unavailable")
	}
}

// A page of a foreign origin is refused 403 origin_not_allowed before
// authentication when it opens a WebSocket or sends the token cookie; a
// listed origin or the server's own host goes on to authentication. A
// preflight from an unlisted origin gets no Access-Control-Allow-Origin,
// and publishing gets no CORS whatever the origin.
func TestOriginRefusals(t *testing.T) {
	const good, evil = "https://app.example.com", "https://evil.example.net"
	n := newNode(t, func(c *api.Config) { c.OriginPatterns = []string{"app.example.com"} })
	cookie := auth.DefaultCookieName + "=" + "not.a.jwt" // refused only if authentication runs
	for _, tc := range []struct {
		name, path, origin, cookie, auth string
		status                           int
		code                             string
	}{
		{"cookie from a foreign origin", "/v1/tasks/task_1", evil, cookie, "", 403, api.OriginNotAllowed},
		{"cookie from a foreign origin, ids", "/v1/tasks?ids=task_1", evil, cookie, "", 403, api.OriginNotAllowed},
		{"cookie from a foreign origin, project", "/v1/projects/p1/tasks", evil, cookie, "", 403, api.OriginNotAllowed},
		{"cookie from a foreign origin, SSE", "/v1/events?task=task_1", evil, cookie, "", 403, api.OriginNotAllowed},
		{"cookie from an opaque origin", "/v1/tasks/task_1", "null", cookie, "", 403, api.OriginNotAllowed},
		{"WebSocket from a foreign origin, bearer", "/v1/ws", evil, "", "Bearer not.a.jwt", 403, api.OriginNotAllowed},
		{"WebSocket from a foreign origin, no token", "/v1/ws", evil, "", "", 403, api.OriginNotAllowed},
		{"cookie from a listed origin", "/v1/tasks/task_1", good, cookie, "", 401, "unauthorized"},
		{"cookie from the server's own host", "/v1/tasks/task_1", n.url, cookie, "", 401, "unauthorized"},
		{"bearer from a foreign origin", "/v1/tasks/task_1", evil, "", "Bearer not.a.jwt", 401, "unauthorized"},
		{"WebSocket from a listed origin", "/v1/ws", good, "", "Bearer not.a.jwt", 401, "unauthorized"},
	} {
		h := map[string]string{"Origin": tc.origin}
		if tc.cookie != "" {
			h["Cookie"] = tc.cookie
		}
		if tc.auth != "" {
			h["Authorization"] = tc.auth
		}
		r := do(t, n.url, req{method: "GET", path: tc.path, header: h})
		wantError(t, tc.name, r, tc.status, tc.code)
		if tc.status == 403 && strings.Contains(string(r.body), "not.a.jwt") {
			t.Errorf("%s: the refusal %q repeats the token", tc.name, r.body)
		}
	}

	for _, tc := range []struct {
		path, origin string
		cors         bool
	}{
		{"/v1/events", evil, false},
		{"/v1/ws", evil, false},
		{"/v1/projects/p1/tasks", evil, false},
		{"/v1/events", good, true},
		{"/v1/publish", good, false},
		{"/v1/publish", evil, false},
	} {
		r := do(t, n.url, req{method: "OPTIONS", path: tc.path, header: map[string]string{
			"Origin": tc.origin, "Access-Control-Request-Method": "GET", "Access-Control-Request-Headers": "authorization",
		}})
		acao, acac := r.header.Get("Access-Control-Allow-Origin"), r.header.Get("Access-Control-Allow-Credentials")
		switch {
		case r.status >= 300:
			t.Errorf("preflight of %s from %s: %d %q", tc.path, tc.origin, r.status, r.body)
		case tc.cors && (acao != tc.origin || acac != "true"):
			t.Errorf("preflight of %s from %s: ACAO %q, ACAC %q; want the origin, with credentials", tc.path, tc.origin, acao, acac)
		case !tc.cors && (acao != "" || acac != ""):
			t.Errorf("preflight of %s from %s: ACAO %q, ACAC %q; want none", tc.path, tc.origin, acao, acac)
		}
	}
}

// Past AuthFailureBurst invalid tokens from one address, that address is
// answered 429 rate_limit_exceeded, with Retry-After in whole seconds equal
// to the body's retry_after and retry_after_ms agreeing with both, before
// any token is looked at (a good
// one too); an X-Forwarded-For from an untrusted peer does not move it to
// another bucket. Missing and expired tokens take nothing from the
// bucket, and another address keeps its own.
func TestAuthFailureLimiter(t *testing.T) {
	const burst, rate = 3, 0.01 // no token comes back within the test
	n := newNode(t, func(c *api.Config) { c.AuthFailureBurst, c.AuthFailureRate = burst, rate })
	good, expired := n.token(t, time.Now().Add(time.Hour)), n.token(t, time.Now().Add(-time.Hour))
	path := "/v1/tasks/task_absent"

	for i := range 2 * burst {
		wantError(t, fmt.Sprint("missing token ", i), do(t, n.url, req{method: "GET", path: path}), 401, "unauthorized")
		wantError(t, fmt.Sprint("expired token ", i), do(t, n.url, req{method: "GET", path: path, header: bearer(expired)}), 401, "token_expired")
	}
	for i := range burst {
		wantError(t, fmt.Sprint("invalid token ", i), do(t, n.url, req{method: "GET", path: path, header: bearer("bad.to.ken")}), 401, "unauthorized")
	}
	for _, tc := range []struct {
		name   string
		header map[string]string
	}{
		{"invalid token past the burst", bearer("bad.to.ken")},
		{"good token past the burst", bearer(good)},
		{"claiming another address", map[string]string{"Authorization": "Bearer " + good, "X-Forwarded-For": "198.51.100.1"}},
	} {
		r := do(t, n.url, req{method: "GET", path: path, header: tc.header})
		wantError(t, tc.name, r, 429, "rate_limit_exceeded")
		var body struct {
			RetryAfter   int64 `json:"retry_after"`
			RetryAfterMS int64 `json:"retry_after_ms"`
		}
		json.Unmarshal(r.body, &body)
		secs, err := strconv.ParseInt(r.header.Get("Retry-After"), 10, 64)
		// The wait is for one token at rate per second, less what refilled
		// during the test.
		if err != nil || secs < 1 || secs > int64(1/rate) || secs != body.RetryAfter ||
			body.RetryAfter*1000 < body.RetryAfterMS || body.RetryAfterMS <= (body.RetryAfter-1)*1000 {
			t.Errorf("%s: Retry-After %q, retry_after %d, retry_after_ms %d; want whole seconds in [1, %d], the header equal to retry_after, the milliseconds rounding up to them",
				tc.name, r.header.Get("Retry-After"), body.RetryAfter, body.RetryAfterMS, int(1/rate))
		}
	}

	// Another address has its own bucket.
	wantError(t, "another address, invalid token", serveFrom(n.h, "203.0.113.8:4000", req{method: "GET", path: path, header: bearer("bad.to.ken")}), 401, "unauthorized")
	wantError(t, "another address, good token", serveFrom(n.h, "203.0.113.8:4000", req{method: "GET", path: path, header: bearer(good)}), 404, "not_found")
}
