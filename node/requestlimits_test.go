package node_test

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/pushd/pushd/internal/testenv"
)

// TestBodiesThatNeverArriveAreCut sends requests whose Content-Length
// promises a body that never comes, to a route that reads it (publish),
// one that does not (healthz) and no route at all: the node closes every
// such connection once --request-timeout has passed, telling a publisher
// why, while /readyz, new streams and streams held past the timeout all
// keep working.
func TestBodiesThatNeverArriveAreCut(t *testing.T) {
	c := newCluster(t)
	cfg := c.config()
	const timeout = 500 * time.Millisecond
	cfg.RequestTimeout = timeout
	s := startNode(t, cfg)
	task := testenv.UniqueID("task")
	c.goPublish(t, doc(task, "t1", 1, "RUNNING"))
	tok := token(t, "t1", "u1")
	sse := openSSE(t, s.URL, tok, "task="+task)
	if v := sse.nextTask(t).Version; v != 1 {
		t.Fatalf("SSE version %d, want 1", v)
	}
	ws := openWS(t, s.URL, tok)
	ws.send(t, map[string]any{"op": "subscribe", "id": 1, "tasks": []string{task}})
	if v := ws.nextTask(t).Version; v != 1 {
		t.Fatalf("WebSocket version %d, want 1", v)
	}
	ws.NextOf(t, "ack")

	const n = 90
	routes := []string{"POST /v1/publish", "GET /healthz", "POST /nowhere"}
	addr := strings.TrimPrefix(s.URL, "http://")
	conns := make([]net.Conn, n)
	sent := make([]time.Time, n)
	for i := range conns {
		conn, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		sent[i] = time.Now()
		if _, err := fmt.Fprintf(conn, "%s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n", routes[i%len(routes)], addr); err != nil {
			t.Fatal(err)
		}
		conns[i] = conn
	}

	// Meanwhile the node answers and takes new streams.
	readyz(t, s.URL, http.StatusOK)
	if v := openSSE(t, s.URL, tok, "task="+task).nextTask(t).Version; v != 1 {
		t.Fatalf("a new SSE stream got version %d, want 1", v)
	}

	const bound = 10 * timeout // generous: the machine is shared and -race is on
	var slowest time.Duration
	for i, conn := range conns {
		conn.SetReadDeadline(sent[i].Add(bound))
		br := bufio.NewReader(conn)
		if routes[i%len(routes)] == "POST /v1/publish" {
			// The publisher is told why.
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				t.Fatalf("connection %d (%s): no answer within %s: %v", i, routes[i%len(routes)], bound, err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			var e struct{ Error, Message string }
			if resp.StatusCode != http.StatusRequestTimeout || json.Unmarshal(body, &e) != nil || e.Error != "request_timeout" || e.Message == "" {
				t.Fatalf("publish without its body: %d %s, want 408 request_timeout", resp.StatusCode, body)
			}
		}
		_, err := io.Copy(io.Discard, br)
		if errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("connection %d (%s) still open %s after its request: the body never came and the timeout is %s", i, routes[i%len(routes)], bound, timeout)
		}
		slowest = max(slowest, time.Since(sent[i]))
	}
	t.Logf("%d connections with a body that never came, request timeout %s: the slowest closed %s after its request", n, timeout, slowest.Round(time.Millisecond))

	// The streams opened before were held past the timeout and still deliver.
	c.goPublish(t, doc(task, "t1", 2, "RUNNING"))
	if v := sse.nextTask(t).Version; v != 2 {
		t.Fatalf("SSE version %d after the request timeout passed, want 2", v)
	}
	if v := ws.nextTask(t).Version; v != 2 {
		t.Fatalf("WebSocket version %d after the request timeout passed, want 2", v)
	}
}

// TestHeaderAndURLLimitsFollowTheirSettings: the URL and header limits are
// the node's settings, not constants.
func TestHeaderAndURLLimitsFollowTheirSettings(t *testing.T) {
	c := newCluster(t)
	cfg := c.config()
	cfg.API.MaxURLBytes, cfg.MaxHeaderBytes = 1<<10, 8<<10
	s := startNode(t, cfg)
	resp, body := httpDo(t, http.MethodGet, s.URL+"/v1/tasks/"+strings.Repeat("a", 2<<10), "", "")
	wantError(t, resp, body, http.StatusRequestURITooLong, "uri_too_long")
	if resp, _ := httpDo(t, http.MethodGet, s.URL+"/healthz", "", "", "X-Padding", strings.Repeat("a", 16<<10)); resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
		t.Fatalf("16 KiB of headers with an 8 KiB limit: %d, want 431", resp.StatusCode)
	}
	if resp, body := httpDo(t, http.MethodGet, s.URL+"/healthz", "", "", "X-Padding", strings.Repeat("a", 4<<10)); resp.StatusCode != http.StatusOK {
		t.Fatalf("4 KiB of headers with an 8 KiB limit: %d %s", resp.StatusCode, body)
	}
}
