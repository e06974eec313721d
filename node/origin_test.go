package node_test

import (
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/pushd/pushd/admission"
	"github.com/pushd/pushd/internal/testenv"
)

const (
	allowedOrigin = "https://app.example.com"
	foreignOrigin = "https://evil.example.net"
)

// dialWSWith dials /v1/ws with the request headers given as name, value
// pairs, and returns the handshake's status and, when refused, its body.
func dialWSWith(t *testing.T, base string, header ...string) (int, *http.Response, string) {
	t.Helper()
	h := http.Header{}
	for i := 0; i+1 < len(header); i += 2 {
		h.Set(header[i], header[i+1])
	}
	c, resp, err := dialWS(t, base, "", &websocket.DialOptions{Subprotocols: []string{"pushd.v1"}, HTTPHeader: h})
	if err == nil {
		c.Close()
		return http.StatusSwitchingProtocols, resp, ""
	}
	if resp == nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp, string(b)
}

// TestCrossOriginWebSocketSpendsNoConnectBudget: a page of a foreign origin
// opening WebSockets with the victim's cookie is refused with 403 and a JSON
// error before authentication and admission, so the victim's connect bucket
// is untouched: the victim still connects its full burst afterwards, from
// the server's own host and from an allowed origin.
func TestCrossOriginWebSocketSpendsNoConnectBudget(t *testing.T) {
	c := newCluster(t)
	cfg := c.config()
	cfg.API.OriginPatterns = []string{"app.example.com"}
	// A bucket that does not refill within the test.
	cfg.Admission = admission.Config{ConnectUserBurst: 3, ConnectUserRate: 0.001, Timeout: 2 * time.Second}
	s := startNode(t, cfg)
	cookie := "pushd_token=" + token(t, "t1", testenv.UniqueID("victim"))

	for range 5 {
		_, resp, body := dialWSWith(t, s.URL, "Origin", foreignOrigin, "Cookie", cookie)
		wantError(t, resp, []byte(body), http.StatusForbidden, "origin_not_allowed")
	}
	sameHost := "http://" + strings.TrimPrefix(s.URL, "http://")
	for i, origin := range []string{sameHost, allowedOrigin, sameHost} {
		if status, _, body := dialWSWith(t, s.URL, "Origin", origin, "Cookie", cookie); status != http.StatusSwitchingProtocols {
			t.Fatalf("the victim's connect %d of its burst of 3, from %s: %d %s", i+1, origin, status, body)
		}
	}
	// The burst is spent: the bucket was the victim's all along.
	status, resp, body := dialWSWith(t, s.URL, "Cookie", cookie)
	want429(t, status, resp.Header, body, "rate_limit_exceeded", time.Hour)
}

// TestCookieSSEFromForeignOriginIsRefused: an SSE stream or a snapshot read
// carrying the token cookie from a foreign origin is refused with 403 and a
// JSON error; from an allowed origin, the server's own host or with no
// Origin (not a browser, or a same-origin GET) it is served; and a request
// whose token the page supplied itself (Authorization or access_token), not
// the browser's cookie, is not checked: CORS decides whether the page may
// read the answer.
func TestCookieSSEFromForeignOriginIsRefused(t *testing.T) {
	c := newCluster(t)
	cfg := c.config()
	cfg.API.OriginPatterns = []string{"app.example.com"}
	s := startNode(t, cfg)
	task := testenv.UniqueID("task")
	c.goPublish(t, doc(task, "t1", 1, "RUNNING"))
	tok := token(t, "t1", "u1")
	cookie := "pushd_token=" + tok
	events, read := s.URL+"/v1/events?task="+task, s.URL+"/v1/tasks/"+task

	for _, u := range []string{events, read} {
		resp, body := openStreamWith(t, http.DefaultClient, u, http.Header{"Origin": {foreignOrigin}, "Cookie": {cookie}})
		wantError(t, resp, body, http.StatusForbidden, "origin_not_allowed")
	}
	// Empty cookie values are no credentials, as for authentication.
	resp, body := openStreamWith(t, http.DefaultClient, events+"&access_token="+tok, http.Header{"Origin": {foreignOrigin}, "Cookie": {"pushd_token="}})
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("an empty cookie from %s: %d %s", foreignOrigin, resp.StatusCode, body)
	}

	sameHost := "http://" + strings.TrimPrefix(s.URL, "http://")
	for _, h := range []http.Header{
		{"Origin": {allowedOrigin}, "Cookie": {cookie}},
		{"Origin": {sameHost}, "Cookie": {cookie}},
		{"Cookie": {cookie}},
		{"Origin": {foreignOrigin}, "Authorization": {"Bearer " + tok}},
	} {
		for _, u := range []string{events, read} {
			if resp, body := openStreamWith(t, http.DefaultClient, u, h); resp.StatusCode != http.StatusOK {
				t.Fatalf("%s with %v: %d %s", u, h, resp.StatusCode, body)
			}
		}
	}
	sse := openSSE(t, s.URL, "", "task="+task, "Origin", allowedOrigin, "Cookie", cookie)
	if got := sse.nextTask(t); got.Version != 1 {
		t.Fatalf("version %d from an allowed origin", got.Version)
	}
}

// TestCrossSiteCookieRequestSpendsNoSlot: what a page of another site
// makes the browser send without CORS (an <img> or a <script> pointing at
// the stream, a link followed) carries the cookie and no Origin, only
// Sec-Fetch-Site. It is refused 403 before it counts against anything, so
// such requests cannot take the user's connection slots: the user's own
// streams (same-origin, typed, not a browser, and an allowed origin's
// EventSource, which sends its Origin) still get every slot the cap
// allows, and the one past the cap is refused for the cap.
func TestCrossSiteCookieRequestSpendsNoSlot(t *testing.T) {
	c := newCluster(t)
	cfg := c.config()
	cfg.API.OriginPatterns = []string{"app.example.com"}
	cfg.Admission = admission.Config{MaxConnsPerUser: 4, Timeout: 2 * time.Second}
	s := startNode(t, cfg)
	task := testenv.UniqueID("task")
	cookie := "pushd_token=" + token(t, "t1", testenv.UniqueID("victim"))
	events, read := s.URL+"/v1/events?task="+task, s.URL+"/v1/tasks/"+task

	for _, site := range []string{"cross-site", "same-site", "cross-site", "same-site"} {
		for _, u := range []string{events, read} {
			resp, body := openStreamWith(t, http.DefaultClient, u, http.Header{"Sec-Fetch-Site": {site}, "Cookie": {cookie}})
			wantError(t, resp, body, http.StatusForbidden, "origin_not_allowed")
		}
	}
	for _, h := range []http.Header{
		{"Sec-Fetch-Site": {"same-origin"}, "Cookie": {cookie}},
		{"Sec-Fetch-Site": {"none"}, "Cookie": {cookie}},
		{"Cookie": {cookie}},
		{"Sec-Fetch-Site": {"cross-site"}, "Origin": {allowedOrigin}, "Cookie": {cookie}},
	} {
		if resp, body := openStreamWith(t, http.DefaultClient, events, h); resp.StatusCode != http.StatusOK {
			t.Fatalf("the user's own stream with %v: %d %s; the cap of 4 should have room", h, resp.StatusCode, body)
		}
	}
	resp, body := openStreamWith(t, http.DefaultClient, events, http.Header{"Cookie": {cookie}})
	want429(t, resp.StatusCode, resp.Header, string(body), "too_many_connections", time.Hour)
}
