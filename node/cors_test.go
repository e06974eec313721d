package node_test

import (
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/pushd/pushd/internal/testenv"
)

// TestCORSOnlyForListedOrigins: a page of a listed origin may read the
// streams and the snapshot API with credentials; any other origin's page
// gets no Access-Control-Allow-Origin, so the browser keeps the response
// from it; publishing gets no CORS at all.
func TestCORSOnlyForListedOrigins(t *testing.T) {
	c := newCluster(t)
	cfg := c.config()
	cfg.API.OriginPatterns = []string{"app.example.com"}
	s := startNode(t, cfg)
	task := testenv.UniqueID("task")
	c.goPublish(t, doc(task, "t1", 1, "RUNNING"))
	tok := token(t, "t1", "u1")
	const good, evil = "https://app.example.com", "https://evil.example.net"

	for _, path := range []string{"/v1/tasks/" + task, "/v1/events?task=" + task} {
		resp := openWithOrigin(t, s.URL+path, tok, good)
		if resp.StatusCode != http.StatusOK || resp.Header.Get("Access-Control-Allow-Origin") != good ||
			resp.Header.Get("Access-Control-Allow-Credentials") != "true" {
			t.Fatalf("%s from %s: %d, ACAO %q, ACAC %q", path, good, resp.StatusCode,
				resp.Header.Get("Access-Control-Allow-Origin"), resp.Header.Get("Access-Control-Allow-Credentials"))
		}
		resp = openWithOrigin(t, s.URL+path, tok, evil)
		if got := resp.Header.Get("Access-Control-Allow-Origin"); got != "" {
			t.Fatalf("%s from %s: ACAO %q, want none", path, evil, got)
		}
	}

	preflight := func(origin string) *http.Response {
		req, _ := http.NewRequest(http.MethodOptions, s.URL+"/v1/tasks/"+task, nil)
		req.Header.Set("Origin", origin)
		req.Header.Set("Access-Control-Request-Method", "GET")
		req.Header.Set("Access-Control-Request-Headers", "authorization")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp
	}
	if resp := preflight(good); resp.Header.Get("Access-Control-Allow-Origin") != good ||
		!strings.Contains(strings.ToLower(resp.Header.Get("Access-Control-Allow-Headers")), "authorization") {
		t.Fatalf("preflight from %s: %d %v", good, resp.StatusCode, resp.Header)
	}
	if resp := preflight(evil); resp.Header.Get("Access-Control-Allow-Origin") != "" {
		t.Fatalf("preflight from %s allowed", evil)
	}

	req, _ := http.NewRequest(http.MethodPost, s.URL+"/v1/publish", strings.NewReader(doc(task, "t1", 2, "RUNNING")))
	req.Header.Set("Origin", good)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if got := resp.Header.Get("Access-Control-Allow-Origin"); got != "" {
		t.Fatalf("publish answered with ACAO %q: publishing is not for pages", got)
	}
}

// openWithOrigin GETs u as a page of origin would, and returns the response
// with its headers (the body, a stream for /v1/events, is closed).
func openWithOrigin(t *testing.T, u, tok, origin string) *http.Response {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, u, nil)
	req.Header.Set("Authorization", "Bearer "+tok)
	req.Header.Set("Origin", origin)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp
}

// TestTokensNeverLogged runs requests that log, at debug level, with
// tokens in every place a client puts them (valid, expired, forged), and
// checks that no log line holds a token or its signature.
func TestTokensNeverLogged(t *testing.T) {
	c := newCluster(t)
	var logs testenv.LogBuffer
	cfg := c.config()
	cfg.Logger = slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	s := startNode(t, cfg)
	task := testenv.UniqueID("task")
	c.goPublish(t, doc(task, "t1", 1, "RUNNING"))
	good := token(t, "t1", "u1")
	tokens := []string{good, tokenExp(t, "t1", "u1", time.Now().Add(-time.Hour)), good[:len(good)-6] + "AAAAAA"}
	for _, tok := range tokens {
		for _, path := range []string{"/v1/tasks/" + task, "/v1/tasks/bad%7Bid", "/v1/events?task=" + task + "&bogus=1"} {
			httpDo(t, http.MethodGet, s.URL+path, tok, "")
			httpDo(t, http.MethodGet, s.URL+path+sepFor(path)+"access_token="+tok, "", "")
			httpDo(t, http.MethodGet, s.URL+path, "", "", "Cookie", "pushd_token="+tok)
		}
	}
	sse := openSSE(t, s.URL, good, "task="+task)
	sse.nextTask(t)
	ws := openWS(t, s.URL, good)
	ws.sendRaw(t, websocket.MessageText, []byte(`{"op":"subscribe","tasks":["`+good+`"]}`))
	ws.NextOf(t, "error")
	sse.Close()
	ws.Close()
	out := logs.String()
	if out == "" {
		t.Fatal("nothing was logged: the test checks nothing")
	}
	for _, tok := range tokens {
		sig := tok[strings.LastIndexByte(tok, '.')+1:]
		if strings.Contains(out, sig) {
			t.Fatalf("a token's signature is in the logs:\n%s", out)
		}
	}
	t.Logf("%d bytes of debug logs checked", len(out))
}

func sepFor(path string) string {
	if strings.Contains(path, "?") {
		return "&"
	}
	return "?"
}
