package api_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/pushd/pushd/fanout"
	"github.com/pushd/pushd/internal/testenv"
	"github.com/pushd/pushd/node/internal/api"
	"github.com/pushd/pushd/snapshot"
)

// stored returns the snapshot Redis holds for task, or nil.
func stored(t *testing.T, rd testenv.Redis, task string) *snapshot.Snapshot {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	raw, err := rd.Client.Get(ctx, rd.Names.Snapshot(task)).Bytes()
	if err != nil {
		return nil
	}
	s, err := snapshot.Parse(raw)
	if err != nil {
		t.Fatalf("stored snapshot of %s: %v", task, err)
	}
	return s
}

// POST /v1/publish with Config.APIKey set takes the key from X-API-Key and
// nowhere else: a missing, empty or wrong header, the key in another
// header or in the query string (under any name) is a 401 with a JSON
// error, from loopback too, and nothing is stored; the key never reaches
// the log. With the right header the snapshot is stored and announced on
// the tenant's channel.
func TestPublishKey(t *testing.T) {
	rd := testenv.SharedRedis(t)
	key := "pk-" + testenv.RandomSuffix(16)
	var logs testenv.LogBuffer
	srv := httptest.NewServer(api.New(api.Config{
		Publisher: fanout.NewRedisPublisher(rd.Client, rd.Names),
		APIKey:    key,
		Logger:    slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
	}))
	t.Cleanup(srv.Close)
	tenant := testenv.UniqueID("tenant")

	for _, tc := range []struct {
		name   string
		query  string
		header map[string]string
		status int
		code   string
	}{
		{"no header", "", nil, 401, "unauthorized"},
		{"empty header", "", map[string]string{"X-API-Key": ""}, 401, "unauthorized"},
		{"wrong key of the same length", "", map[string]string{"X-API-Key": strings.Repeat("x", len(key))}, 401, "unauthorized"},
		{"a prefix of the key", "", map[string]string{"X-API-Key": key[:len(key)-1]}, 401, "unauthorized"},
		{"the key and more", "", map[string]string{"X-API-Key": key + "x"}, 401, "unauthorized"},
		{"the key upper-cased", "", map[string]string{"X-API-Key": strings.ToUpper(key)}, 401, "unauthorized"},
		{"the key as a bearer token", "", map[string]string{"Authorization": "Bearer " + key}, 401, "unauthorized"},
		{"the key as another header", "", map[string]string{"X-Api-Token": key, "Api-Key": key}, 401, "unauthorized"},
		{"?api_key=", "?api_key=" + key, nil, 401, "unauthorized"},
		{"?key=", "?key=" + key, nil, 401, "unauthorized"},
		{"?X-API-Key=", "?X-API-Key=" + key, nil, 401, "unauthorized"},
		{"?access_token=", "?access_token=" + key, nil, 401, "unauthorized"},
		// With the right header the query is still no place for a key: the
		// parameter is refused, without its value in the message.
		{"right header and ?api_key=", "?api_key=" + key, map[string]string{"X-API-Key": key}, 400, "unknown_parameter"},
		{"right header and ?access_token=", "?access_token=" + key, map[string]string{"X-API-Key": key}, 400, "unknown_parameter"},
	} {
		task := testenv.UniqueID("task")
		r := do(t, srv.URL, req{method: "POST", path: "/v1/publish" + tc.query, header: tc.header, body: doc(task, tenant, 1, "")})
		wantError(t, tc.name, r, tc.status, tc.code)
		if strings.Contains(string(r.body), key) {
			t.Errorf("%s: the answer %q repeats the key", tc.name, r.body)
		}
		if s := stored(t, rd, task); s != nil {
			t.Errorf("%s: stored %s v%d", tc.name, s.TaskID, s.Version)
		}
	}

	// The right key: stored, and announced to the tenant's channel.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	sub := rd.Client.Subscribe(ctx, rd.Names.Channel(tenant))
	defer sub.Close()
	if _, err := sub.Receive(ctx); err != nil { // the subscription's confirmation
		t.Fatal(err)
	}
	task := testenv.UniqueID("task")
	r := do(t, srv.URL, req{method: "POST", path: "/v1/publish", header: map[string]string{"X-API-Key": key}, body: doc(task, tenant, 3, "")})
	var res struct {
		Written bool   `json:"written"`
		TaskID  string `json:"task_id"`
		Version int64  `json:"version"`
	}
	if err := json.Unmarshal(r.body, &res); r.status != http.StatusOK || err != nil || !res.Written || res.TaskID != task || res.Version != 3 {
		t.Fatalf("publish with the key: %d %q", r.status, r.body)
	}
	if s := stored(t, rd, task); s == nil || s.TenantID != tenant || s.Version != 3 {
		t.Fatalf("stored %+v, want %s v3 of %s", s, task, tenant)
	}
	msg, err := sub.ReceiveMessage(ctx)
	if err != nil {
		t.Fatalf("no announcement: %v", err)
	}
	var n snapshot.Notification
	if err := json.Unmarshal([]byte(msg.Payload), &n); err != nil || n.TaskID != task || n.Version != 3 {
		t.Fatalf("announced %q on %s (%v), want %s v3", msg.Payload, msg.Channel, err, task)
	}

	out := logs.String()
	if !strings.Contains(out, "request refused") {
		t.Fatalf("the refusals were not logged at debug level, so the check below proves nothing:\n%s", out)
	}
	if strings.Contains(out, key) {
		t.Errorf("the key is in the log:\n%s", out)
	}
}

// Without Config.APIKey only loopback callers may publish: the TCP peer
// must be a loopback address, and behind a trusted proxy so must be the
// client it names, since a proxy on the same host makes every client's
// peer loopback. X-Forwarded-For or X-Real-IP from anyone else cannot make
// a caller loopback. Refusals are 403 forbidden and store nothing.
func TestPublishWithoutKeyOnlyFromLoopback(t *testing.T) {
	rd := testenv.SharedRedis(t)
	pub := fanout.NewRedisPublisher(rd.Client, rd.Names)
	cidr := func(s string) *net.IPNet {
		_, n, err := net.ParseCIDR(s)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	direct := api.New(api.Config{Publisher: pub})
	remoteLB := api.New(api.Config{Publisher: pub, TrustedProxies: []*net.IPNet{cidr("203.0.113.0/24")}})
	localProxy := api.New(api.Config{Publisher: pub, TrustedProxies: []*net.IPNet{cidr("127.0.0.1/32")}})

	// Over a real socket, the test is a loopback caller.
	srv := httptest.NewServer(direct)
	t.Cleanup(srv.Close)
	task := testenv.UniqueID("task")
	if r := do(t, srv.URL, req{method: "POST", path: "/v1/publish", body: doc(task, "t1", 1, "")}); r.status != http.StatusOK {
		t.Fatalf("loopback caller: %d %q", r.status, r.body)
	}
	if s := stored(t, rd, task); s == nil || s.Version != 1 {
		t.Fatalf("loopback caller: stored %+v", s)
	}

	for _, tc := range []struct {
		name    string
		h       http.Handler
		remote  string
		header  map[string]string
		allowed bool
	}{
		{"127.0.0.1", direct, "127.0.0.1:4000", nil, true},
		{"127.0.0.2", direct, "127.0.0.2:4000", nil, true},
		{"::1", direct, "[::1]:4000", nil, true},
		{"remote IPv4", direct, "203.0.113.7:4000", nil, false},
		{"remote IPv6", direct, "[2001:db8::1]:4000", nil, false},
		{"unparsable peer", direct, "somewhere", nil, false},
		{"remote claiming loopback in X-Forwarded-For", direct, "203.0.113.7:4000", map[string]string{"X-Forwarded-For": "127.0.0.1"}, false},
		{"remote claiming loopback in X-Real-IP", direct, "203.0.113.7:4000", map[string]string{"X-Real-IP": "127.0.0.1"}, false},
		{"trusted remote LB naming loopback", remoteLB, "203.0.113.7:4000", map[string]string{"X-Forwarded-For": "127.0.0.1"}, false},
		{"local proxy without X-Forwarded-For", localProxy, "127.0.0.1:4000", nil, true},
		{"local proxy naming a loopback client", localProxy, "127.0.0.1:4000", map[string]string{"X-Forwarded-For": "127.0.0.1"}, true},
		{"local proxy naming a remote client", localProxy, "127.0.0.1:4000", map[string]string{"X-Forwarded-For": "198.51.100.9"}, false},
		{"local proxy, remote client claiming loopback", localProxy, "127.0.0.1:4000", map[string]string{"X-Forwarded-For": "127.0.0.1, 198.51.100.9"}, false},
	} {
		task := testenv.UniqueID("task")
		r := serveFrom(tc.h, tc.remote, req{method: "POST", path: "/v1/publish", header: tc.header, body: doc(task, "t1", 1, "")})
		s := stored(t, rd, task)
		switch {
		case tc.allowed && (r.status != http.StatusOK || s == nil):
			t.Errorf("%s: %d %q, stored %v; want it published", tc.name, r.status, r.body, s != nil)
		case !tc.allowed:
			wantError(t, tc.name, r, http.StatusForbidden, "forbidden")
			if s != nil {
				t.Errorf("%s: refused, yet stored", tc.name)
			}
		}
	}
}

// POST /v1/publish without an API key refuses, over a real socket from
// loopback, what a web page open in a browser on the same machine can
// send: a simple content type (a form, or fetch with a string body, sent
// without a preflight), an Origin other than the node's own host, or a
// Fetch Metadata mark of another site. JSON, or no content type, from a
// client that is no browser publishes; with a key, the key decides.
func TestPublishWithoutKeyRefusesWhatAPageCanSend(t *testing.T) {
	rd := testenv.SharedRedis(t)
	pub := fanout.NewRedisPublisher(rd.Client, rd.Names)
	keyless := httptest.NewServer(api.New(api.Config{Publisher: pub}))
	t.Cleanup(keyless.Close)
	keyed := httptest.NewServer(api.New(api.Config{Publisher: pub, APIKey: "k3y"}))
	t.Cleanup(keyed.Close)
	own := strings.TrimPrefix(keyless.URL, "http://")
	for _, tc := range []struct {
		name   string
		header map[string]string
		status int
		code   string
	}{
		{"JSON", map[string]string{"Content-Type": "application/json"}, http.StatusOK, ""},
		{"no content type", nil, http.StatusOK, ""},
		{"JSON from the node's own origin", map[string]string{"Content-Type": "application/json", "Origin": "http://" + own}, http.StatusOK, ""},
		{"a form", map[string]string{"Content-Type": "application/x-www-form-urlencoded"}, http.StatusUnsupportedMediaType, "unsupported_media_type"},
		{"fetch with a string body", map[string]string{"Content-Type": "text/plain;charset=UTF-8"}, http.StatusUnsupportedMediaType, "unsupported_media_type"},
		{"a multipart form", map[string]string{"Content-Type": "multipart/form-data; boundary=x"}, http.StatusUnsupportedMediaType, "unsupported_media_type"},
		{"spelled loosely", map[string]string{"Content-Type": " Text/Plain ; x"}, http.StatusUnsupportedMediaType, "unsupported_media_type"},
		{"a foreign origin", map[string]string{"Content-Type": "application/json", "Origin": "https://evil.example"}, http.StatusForbidden, "origin_not_allowed"},
		{"an opaque origin", map[string]string{"Origin": "null"}, http.StatusForbidden, "origin_not_allowed"},
		{"cross-site", map[string]string{"Sec-Fetch-Site": "cross-site"}, http.StatusForbidden, "origin_not_allowed"},
		{"same-site", map[string]string{"Sec-Fetch-Site": "same-site"}, http.StatusForbidden, "origin_not_allowed"},
	} {
		task := testenv.UniqueID("task")
		r := do(t, keyless.URL, req{method: "POST", path: "/v1/publish", header: tc.header, body: doc(task, "t1", 1, "")})
		s := stored(t, rd, task)
		if tc.status == http.StatusOK {
			if r.status != http.StatusOK || s == nil {
				t.Errorf("%s: %d %q, stored %v; want it published", tc.name, r.status, r.body, s != nil)
			}
			continue
		}
		wantError(t, tc.name, r, tc.status, tc.code)
		if s != nil {
			t.Errorf("%s: refused, yet stored", tc.name)
		}
		// The key is the guard where there is one: a page cannot send it.
		h := map[string]string{"X-API-Key": "k3y"}
		for k, v := range tc.header {
			h[k] = v
		}
		if r := do(t, keyed.URL, req{method: "POST", path: "/v1/publish", header: h, body: doc(task, "t1", 1, "")}); r.status != http.StatusOK {
			t.Errorf("%s with the API key: %d %q, want it published", tc.name, r.status, r.body)
		}
	}
}
