package node_test

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/pushd/pushd/hub"
	"github.com/pushd/pushd/internal/testenv"
)

func TestSlowReaderDoesNotDelayOthers(t *testing.T) {
	c := newCluster(t)
	cfg := c.config()
	// Long enough that the good client catches up before the slow one is
	// cut even on a loaded machine; the cut is awaited below.
	cfg.Hub.WriteTimeout = 8 * time.Second
	s := startNode(t, cfg)
	const tasks, rounds = 40, 4
	ids := make([]string, tasks)
	query := make([]string, tasks)
	for i := range ids {
		ids[i] = testenv.UniqueID("task")
		query[i] = "task=" + ids[i]
		c.goPublish(t, doc(ids[i], "t1", 1, "RUNNING"))
	}
	tok := token(t, "t1", "u1")

	// A client that reads its headers and hello, then never reads again.
	stalledSSE(t, s.URL, tok, query)
	good := openSSE(t, s.URL, tok, strings.Join(query, "&"))
	for range tasks {
		good.nextTask(t)
	}
	if n := s.Hub().Len(); n != 2 {
		t.Fatalf("%d connections, want 2", n)
	}

	// Far more than socket buffers hold: the slow client's writer blocks.
	pad := strings.Repeat("x", 60<<10)
	for v := int64(2); v <= rounds+1; v++ {
		for _, id := range ids {
			c.goPublish(t, strings.Replace(doc(id, "t1", v, "RUNNING"), `"x_custom"`, `"pad":"`+pad+`","x_custom"`, 1))
		}
	}
	latest := make(map[string]int64)
	for done := 0; done < tasks; {
		snap := good.nextTask(t)
		if snap.Version == rounds+1 && latest[snap.TaskID] != rounds+1 {
			done++
		}
		latest[snap.TaskID] = snap.Version
	}
	// Everything reached the good client while the slow one was still
	// connected: nobody waited for its write timeout.
	st := s.Hub().Stats()
	if n, we := s.Hub().Len(), st.Cuts[hub.CutWriteFailed]; n != 2 || we != 0 {
		t.Fatalf("after the good client caught up: %d connections, %d write errors; the slow client was cut before, so the test proves nothing", n, we)
	}
	if st.Conflated == 0 {
		t.Fatal("nothing conflated: the slow client's outbox did not bound what it holds")
	}
	// And the slow client is disconnected and counted once its write times out.
	testenv.Eventually(t, "the slow client cut and counted", func() bool {
		return s.Hub().Len() == 1 && s.Hub().Stats().Cuts[hub.CutWriteFailed] > 0
	})
}

// rawSSE opens an SSE request on a bare socket, so the client side holds no
// goroutine, and reads until the first task event.
func rawSSE(t *testing.T, base, tok, query string) net.Conn {
	t.Helper()
	conn, err := net.Dial("tcp", strings.TrimPrefix(base, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	fmt.Fprintf(conn, "GET /v1/events?%s HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\n\r\n", query, tok)
	conn.SetReadDeadline(time.Now().Add(waitFor))
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("raw SSE: %v %v", resp, err)
	}
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			t.Fatalf("raw SSE: %v", err)
		}
		if strings.HasPrefix(line, "event: task") {
			return conn
		}
	}
}

func TestIdleSSEConnectionsHoldNoGoroutine(t *testing.T) {
	c := newCluster(t)
	s := startNode(t, c.config())
	task := testenv.UniqueID("task")
	c.goPublish(t, doc(task, "t1", 1, "RUNNING"))
	tok := token(t, "t1", "u1")
	rawSSE(t, s.URL, tok, "task="+task) // warm up the node's own goroutines (reaper, bus)
	before := runtime.NumGoroutine()
	const n = 300
	conns := make([]net.Conn, n)
	for i := range conns {
		conns[i] = rawSSE(t, s.URL, tok, "task="+task)
	}
	if after := runtime.NumGoroutine(); after-before > 10 {
		t.Fatalf("%d more goroutines for %d idle SSE connections; they should hold none", after-before, n)
	}
	// They are all live: a change reaches every one.
	c.goPublish(t, doc(task, "t1", 2, "RUNNING"))
	for _, conn := range conns {
		br := bufio.NewReader(conn)
		for {
			line, err := br.ReadString('\n')
			if err != nil {
				t.Fatal(err)
			}
			if strings.Contains(line, `"version":2,`) {
				break
			}
		}
	}
}

func TestIdleWebSocketConnectionsHoldOneGoroutine(t *testing.T) {
	c := newCluster(t)
	s := startNode(t, c.config())
	task := testenv.UniqueID("task")
	c.goPublish(t, doc(task, "t1", 1, "RUNNING"))
	tok := token(t, "t1", "u1")
	warm := openWS(t, s.URL, tok)
	warm.send(t, map[string]any{"op": "subscribe", "id": 1, "tasks": []string{task}})
	warm.nextTask(t)
	before := runtime.NumGoroutine()
	const n = 100
	for range n {
		w := openWS(t, s.URL, tok)
		w.send(t, map[string]any{"op": "subscribe", "id": 1, "tasks": []string{task}})
		w.nextTask(t)
		w.NextOf(t, "ack")
	}
	// Each connection costs the test's client one reader goroutine and the
	// server one: its reader. Nothing is parked for writing or pinging.
	if per := float64(runtime.NumGoroutine()-before) / n; per > 2.1 {
		t.Fatalf("%.2f goroutines per WebSocket connection (client and server together), want 2", per)
	}
}

func TestUnresponsiveWebSocketPeerIsClosedAfterPing(t *testing.T) {
	c := newCluster(t)
	cfg := c.config()
	cfg.Hub.HeartbeatInterval = 100 * time.Millisecond
	cfg.Hub.WriteTimeout = 500 * time.Millisecond
	s := startNode(t, cfg)
	// A peer that never reads never answers pings.
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	u := "ws" + strings.TrimPrefix(s.URL, "http") + "/v1/ws?access_token=" + token(t, "t1", "u1")
	conn, _, err := websocket.Dial(ctx, u, &websocket.DialOptions{Subprotocols: []string{"pushd.v1"}})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.CloseNow()
	testenv.Eventually(t, "a peer that answers no ping closed", func() bool {
		return s.Hub().Stats().Opened > 0 && s.Hub().Len() == 0
	})
}

// stalledSSE opens an SSE stream for query that reads its response headers
// and then nothing more, with a small receive buffer so the server's
// writes block sooner. The connection closes when the test ends.
func stalledSSE(t *testing.T, base, tok string, query []string) { stalledSSEConn(t, base, tok, query) }
