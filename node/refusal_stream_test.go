package node_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/pushd/pushd/admission"
	"github.com/pushd/pushd/internal/testenv"
	"github.com/pushd/pushd/sse"
)

// getStream asks for u through client as an EventSource does (Accept:
// text/event-stream) or, with accept false, as curl does, and reads the
// answer to its end: a refusal ends by itself.
func getStream(t *testing.T, client *http.Client, u string, accept bool) (*http.Response, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if accept {
		req.Header.Set("Accept", "text/event-stream")
	}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("reading the answer to its end: %v (got %q)", err, b)
	}
	return resp, string(b)
}

// wantStreamRefusal checks the answer an EventSource gets to a refusal that
// passes: 200 text/event-stream, not to be stored, a retry: of the wait
// plus at most half of it again, one error event whose data is the
// refusal's JSON body with code and that wait, and the end of the body.
func wantStreamRefusal(t *testing.T, resp *http.Response, body, code string, wait time.Duration) {
	t.Helper()
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("%d %q %q, want 200 text/event-stream", resp.StatusCode, resp.Header.Get("Content-Type"), body)
	}
	if cc := resp.Header.Get("Cache-Control"); cc != "no-store" {
		t.Fatalf("Cache-Control %q, want no-store", cc)
	}
	if ra := resp.Header.Get("Retry-After"); ra != "" {
		t.Fatalf("a 200 with Retry-After %q", ra)
	}
	lines := strings.Split(body, "\n")
	if len(lines) != 5 || !strings.HasPrefix(lines[0], "retry: ") || lines[1] != "event: error" ||
		!strings.HasPrefix(lines[2], "data: ") || lines[3] != "" || lines[4] != "" {
		t.Fatalf("body %q, want a retry:, one error event and the end", body)
	}
	retry, err := strconv.ParseInt(strings.TrimPrefix(lines[0], "retry: "), 10, 64)
	if err != nil {
		t.Fatalf("retry: %q", lines[0])
	}
	var r refusal
	if err := json.Unmarshal([]byte(strings.TrimPrefix(lines[2], "data: ")), &r); err != nil || r.Error != code || r.Message == "" {
		t.Fatalf("data %q, want the JSON body of %s with a message", lines[2], code)
	}
	wantWait(t, lines[2], r.RetryAfter, r.RetryAfterMS)
	if r.RetryAfterMS > wait.Milliseconds() {
		t.Fatalf("retry_after_ms %d, want at most %v", r.RetryAfterMS, wait)
	}
	// The jitter every retry: the node sends has: never sooner than told.
	if retry < r.RetryAfterMS || retry > r.RetryAfterMS+r.RetryAfterMS/2+1 {
		t.Fatalf("retry: %d, want retry_after_ms %d plus at most half of it", retry, r.RetryAfterMS)
	}
}

// wantRefusedBothWays checks a refusal of u that passes, with a 429 for
// its status: a stream to an EventSource, the 429 to curl.
func wantRefusedBothWays(t *testing.T, client *http.Client, u, code string, wait time.Duration) {
	t.Helper()
	resp, body := getStream(t, client, u, true)
	wantStreamRefusal(t, resp, body, code, wait)
	resp, body = getStream(t, client, u, false)
	want429(t, resp.StatusCode, resp.Header, body, code, wait)
}

// Each refusal of a stream that passes by itself is answered to an
// EventSource in a stream it survives, and with its status to a client that
// did not ask for a stream; refusals that do not pass keep their status
// for both.
func TestEventSourceRefusalsThatPassAreStreams(t *testing.T) {
	c := newCluster(t)
	task := testenv.UniqueID("task")
	c.goPublish(t, doc(task, "t1", 1, "RUNNING"))
	events := func(s *server, tok string) string {
		return s.URL + "/v1/events?task=" + task + "&access_token=" + url.QueryEscape(tok)
	}
	here := clientFrom("127.0.0.1")

	t.Run("connect rate limit", func(t *testing.T) {
		s := admissionNode(t, c, admission.Config{ConnectUserBurst: 1, ConnectUserRate: 0.5})
		u := events(s, token(t, "t1", testenv.UniqueID("user")))
		openStream(t, here, u) // the bucket's one connect
		wantRefusedBothWays(t, here, u, "rate_limit_exceeded", 2*time.Second)
		// Counted as every refusal is, whatever the answer's form.
		if n := s.Admission().Stats().Rejected[admission.RuleConnectUser]; n != 2 {
			t.Fatalf("connect_user rejections counted: %d, want 2", n)
		}
	})

	t.Run("user cap", func(t *testing.T) {
		s := admissionNode(t, c, admission.Config{MaxConnsPerUser: 1})
		u := events(s, token(t, "t1", testenv.UniqueID("user")))
		openStream(t, here, u)
		waitConns(t, s, 1)
		wantRefusedBothWays(t, here, u, "too_many_connections", 5*time.Second)
		if n := s.Admission().Stats().Rejected[admission.RuleUserCap]; n != 2 {
			t.Fatalf("user_cap rejections counted: %d, want 2", n)
		}
		// A client that keeps connections alive is told the refusal ends
		// the connection, as a stream's end does: one that reads an event
		// stream to the close, not to its length, is not left waiting.
		keepAlive := &http.Transport{}
		defer keepAlive.CloseIdleConnections()
		if resp, body := getStream(t, &http.Client{Transport: keepAlive}, u, true); !resp.Close {
			t.Fatalf("the refusal %q keeps the connection open", body)
		}
	})

	t.Run("connections per address", func(t *testing.T) {
		cfg := c.config()
		cfg.API.MaxConnsPerIP = 1
		s := startNode(t, cfg)
		u := events(s, token(t, "t1", "u1"))
		openStream(t, here, u)
		waitConns(t, s, 1)
		wantRefusedBothWays(t, here, u, "too_many_connections", 5*time.Second)
	})

	t.Run("over capacity", func(t *testing.T) {
		cfg := c.config()
		cfg.MaxConns = 1
		s := startNode(t, cfg)
		u := events(s, token(t, "t1", "u1"))
		openStream(t, here, u)
		waitConns(t, s, 1)
		resp, body := getStream(t, here, u, true)
		wantStreamRefusal(t, resp, body, "over_capacity", 5*time.Second)
		resp, body = getStream(t, here, u, false)
		wantError(t, resp, []byte(body), http.StatusServiceUnavailable, "over_capacity")
		if ra := resp.Header.Get("Retry-After"); ra != "5" {
			t.Fatalf("503 over_capacity with Retry-After %q, want 5", ra)
		}
	})

	t.Run("draining", func(t *testing.T) {
		cfg := c.config()
		cfg.SSE = sse.Config{Retry: 1500 * time.Millisecond}
		s := startNode(t, cfg)
		// The hub alone, as Shutdown starts: the listener stays open.
		if err := s.Hub().Shutdown(context.Background(), 0); err != nil {
			t.Fatal(err)
		}
		u := events(s, token(t, "t1", "u1"))
		// A draining node's 503 carries no wait: the stream's is --sse-retry's.
		resp, body := getStream(t, here, u, true)
		wantStreamRefusal(t, resp, body, "draining", cfg.SSE.Retry)
		resp, body = getStream(t, here, u, false)
		wantError(t, resp, []byte(body), http.StatusServiceUnavailable, "draining")
		if ra := resp.Header.Get("Retry-After"); ra != "" {
			t.Fatalf("503 draining with Retry-After %q, as it never had", ra)
		}
	})

	t.Run("failed authentications", func(t *testing.T) {
		cfg := c.config()
		cfg.API.AuthFailureBurst, cfg.API.AuthFailureRate = 1, 0.5
		s := startNode(t, cfg)
		// A bad token is refused for good, even to an EventSource ...
		resp, body := getStream(t, here, events(s, "not-a-token"), true)
		wantError(t, resp, []byte(body), http.StatusUnauthorized, "unauthorized")
		// ... and spent the address's one failure: the next request, whatever
		// its token, waits for the bucket, which passes.
		resp, body = getStream(t, here, events(s, token(t, "t1", "u1")), true)
		wantStreamRefusal(t, resp, body, "rate_limit_exceeded", 2*time.Second)
		resp, body = getStream(t, here, events(s, token(t, "t1", "u1")), false)
		want429(t, resp.StatusCode, resp.Header, body, "rate_limit_exceeded", 2*time.Second)
	})

	t.Run("session store unavailable", func(t *testing.T) {
		pc := newPrivateCluster(t)
		cfg, proxy := pc.configPostgresBehindProxy(t)
		cfg.SSE = sse.Config{Retry: 1500 * time.Millisecond}
		s := startNode(t, cfg)
		// Neither store of sessions answers: whether the token is good
		// cannot be told, and will be once they do.
		pc.rs.Stop()
		proxy.Drop()
		u := events(s, sessionToken())
		resp, body := getStream(t, here, u, true)
		wantStreamRefusal(t, resp, body, "unavailable", cfg.SSE.Retry)
		resp, body = getStream(t, here, u, false)
		wantError(t, resp, []byte(body), http.StatusServiceUnavailable, "unavailable")
	})

	t.Run("refusals that do not pass", func(t *testing.T) {
		s := startNode(t, c.config())
		for _, tc := range []struct {
			what, u, code string
			status        int
		}{
			{"no token", s.URL + "/v1/events?task=" + task, "unauthorized", http.StatusUnauthorized},
			{"a bad token", events(s, "not-a-token"), "unauthorized", http.StatusUnauthorized},
			{"an expired token", events(s, tokenExp(t, "t1", "u1", time.Now().Add(-time.Minute))), "token_expired", http.StatusUnauthorized},
			{"a malformed request", events(s, token(t, "t1", "u1")) + "&scope=all", "bad_request", http.StatusBadRequest},
			{"an unknown parameter", events(s, token(t, "t1", "u1")) + "&x=1", "unknown_parameter", http.StatusBadRequest},
		} {
			resp, body := getStream(t, here, tc.u, true)
			if resp.StatusCode != tc.status {
				t.Fatalf("%s: %d %q, want %d", tc.what, resp.StatusCode, body, tc.status)
			}
			wantError(t, resp, []byte(body), tc.status, tc.code)
		}
	})
}

// The snapshot API keeps its answers whatever the request accepts: only
// the stream's endpoint answers refusals in a stream.
func TestSnapshotAPIRefusalsKeepTheirStatus(t *testing.T) {
	c := newCluster(t)
	s := admissionNode(t, c, admission.Config{Plans: map[string]int{admission.PlanFree: 1}})
	tok := token(t, testenv.UniqueID("tenant"), "u1")
	u := s.URL + "/v1/tasks/" + testenv.UniqueID("task")
	httpDo(t, http.MethodGet, u, tok, "", "Accept", "text/event-stream")
	resp, body := httpDo(t, http.MethodGet, u, tok, "", "Accept", "text/event-stream")
	want429(t, resp.StatusCode, resp.Header, string(body), "rate_limit_exceeded", time.Minute)
}
