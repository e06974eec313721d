package node_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/pushd/pushd/internal/testenv"
	"github.com/pushd/pushd/node"
)

// hello is what a hello says about the mode; hasReason tells a reason
// left out from an empty one.
type hello struct {
	Mode      string
	Reason    string
	hasReason bool
}

func readHello(t *testing.T, transport string, data []byte) hello {
	t.Helper()
	var m map[string]json.RawMessage
	if err := json.Unmarshal(data, &m); err != nil {
		t.Fatalf("%s hello %s: %v", transport, data, err)
	}
	var h hello
	json.Unmarshal(m["mode"], &h.Mode)
	_, h.hasReason = m["reason"]
	json.Unmarshal(m["reason"], &h.Reason)
	return h
}

// helloOfSSE opens a stream and returns its hello, its first event.
func helloOfSSE(t *testing.T, s *server, tok, task string) hello {
	t.Helper()
	cl := openSSE(t, s.URL, tok, "task="+task)
	defer cl.Close()
	ev := cl.Next(t)
	if ev.Event != "hello" {
		t.Fatalf("SSE: first event %q, want hello", ev.Event)
	}
	return readHello(t, "SSE", []byte(ev.Data))
}

// helloOfWS opens a WebSocket and returns its hello, its first message.
func helloOfWS(t *testing.T, s *server, tok string) hello {
	t.Helper()
	cl := openWS(t, s.URL, tok)
	defer cl.Close()
	m := cl.nextAny(t)
	if typ := msgType(m); typ != "hello" {
		t.Fatalf("WebSocket: first message %q, want hello", typ)
	}
	b, _ := json.Marshal(m)
	return readHello(t, "WebSocket", b)
}

// nextMode reads the SSE client's next mode event, skipping tasks.
func (c *sseClient) nextMode(t *testing.T) hello {
	t.Helper()
	for {
		if ev := c.Next(t); ev.Event == "mode" {
			return readHello(t, "SSE mode", []byte(ev.Data))
		}
	}
}

// A hello states the node's mode and, while it polls, why; "restored" is
// news for the connections open when the bus came back, not a state a new
// connection is told about. SSE and WebSocket say the same.
func TestHelloCarriesAReasonOnlyWhileItIsCurrent(t *testing.T) {
	c := newPrivateCluster(t)
	s := startNode(t, c.config())
	task := testenv.UniqueID("task")
	c.write(t, task, 1, true)
	tok := token(t, "t1", "u1")
	want := func(name string, got, want hello) {
		t.Helper()
		if got != want {
			t.Fatalf("%s: mode %q reason %q (present %v), want mode %q reason %q (present %v)",
				name, got.Mode, got.Reason, got.hasReason, want.Mode, want.Reason, want.hasReason)
		}
	}
	push := hello{Mode: "push"}
	want("SSE hello before the outage", helloOfSSE(t, s, tok, task), push)
	want("WebSocket hello before the outage", helloOfWS(t, s, tok), push)

	watcher := openSSE(t, s.URL, tok, "task="+task)
	if s := watcher.nextTask(t); s.Version != 1 {
		t.Fatalf("watcher got v%d, want v1", s.Version)
	}
	c.rs.Stop()
	polling := hello{Mode: "polling", Reason: "pubsub_down", hasReason: true}
	want("mode event at the outage", watcher.nextMode(t), polling)
	want("SSE hello while polling", helloOfSSE(t, s, tok, task), polling)
	want("WebSocket hello while polling", helloOfWS(t, s, tok), polling)

	c.rs.Start()
	want("mode event at the recovery", watcher.nextMode(t), hello{Mode: "push", Reason: "restored", hasReason: true})
	want("SSE hello after the recovery", helloOfSSE(t, s, tok, task), push)
	want("WebSocket hello after the recovery", helloOfWS(t, s, tok), push)
}

// An idle connection is sent a heartbeat a client's own code can see: an
// SSE event named heartbeat (EventSource shows no comment), and on
// WebSocket a heartbeat message beside the ping (a browser answers pings
// unseen). Both say nothing else, so a client that ignores them loses
// nothing.
func TestIdleConnectionsAreSentVisibleHeartbeats(t *testing.T) {
	cfg := node.Config{JWTSecret: testSecret}
	cfg.Hub.HeartbeatInterval = 100 * time.Millisecond
	s := startNode(t, cfg)
	tok := token(t, "t1", "u1")

	sse := openSSE(t, s.URL, tok, "task="+testenv.UniqueID("task"))
	for range 3 { // several, so none is a write the subscription caused
		ev := sse.nextHeartbeat(t)
		if ev.Data != "{}" || ev.ID != "" {
			t.Fatalf("SSE heartbeat: id %q data %q, want no id and data {}", ev.ID, ev.Data)
		}
	}

	ws := openWS(t, s.URL, tok)
	ws.send(t, map[string]any{"op": "subscribe", "id": 1, "tasks": []string{testenv.UniqueID("task")}})
	for range 3 {
		for {
			m := ws.nextAny(t)
			if msgType(m) != "heartbeat" {
				continue
			}
			if got := rawString(m); got != `{"type":"heartbeat"}` {
				t.Fatalf("WebSocket heartbeat %s, want {\"type\":\"heartbeat\"}", got)
			}
			break
		}
	}
}

// nextHeartbeat reads the SSE client's next heartbeat, skipping the rest.
func (c *sseClient) nextHeartbeat(t *testing.T) testenv.SSEEvent {
	t.Helper()
	timer := time.NewTimer(waitFor)
	defer timer.Stop()
	for {
		select {
		case ev, ok := <-c.Events():
			if !ok {
				t.Fatal("SSE stream ended, want a heartbeat")
			}
			if ev.Event == "heartbeat" {
				return ev
			}
		case <-timer.C:
			t.Fatal("no SSE heartbeat within", waitFor)
		}
	}
}
