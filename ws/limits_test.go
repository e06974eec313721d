package ws

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/pushd/pushd/hub"
)

// serve runs a Handler over an in-memory hub on a real socket and returns
// its ws:// URL.
func serve(t *testing.T, cfg Config) string {
	t.Helper()
	_, addr := serveHub(t, hub.Config{}, cfg)
	return "ws://" + addr
}

func dial(t *testing.T, u string) *websocket.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, _, err := websocket.Dial(ctx, u, &websocket.DialOptions{Subprotocols: []string{Subprotocol}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.CloseNow() })
	return c
}

// readUntil reads frames until one contains want, which it returns, or
// fails.
func readUntil(t *testing.T, c *websocket.Conn, want string) []byte {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for {
		_, b, err := c.Read(ctx)
		if err != nil {
			t.Fatalf("waiting for %s: %v", want, err)
		}
		if strings.Contains(string(b), want) {
			return b
		}
	}
}

// TestSilentConnectionIsClosedWith1008: a client that connects and never
// asks for anything is told why and closed.
func TestSilentConnectionIsClosedWith1008(t *testing.T) {
	u := serve(t, Config{FirstRequestTimeout: 100 * time.Millisecond})
	c := dial(t, u)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var err error
	for err == nil {
		_, _, err = c.Read(ctx) // the hello, then the close
	}
	var ce websocket.CloseError
	if !errors.As(err, &ce) || ce.Code != websocket.StatusPolicyViolation || !strings.Contains(ce.Reason, "no request within") {
		t.Fatalf("want close 1008 naming the missing request, got %v", err)
	}
}

// TestFirstRequestDisarmsTheDeadline: a connection that subscribed, even to
// nothing, stays open past the first-request deadline.
func TestFirstRequestDisarmsTheDeadline(t *testing.T) {
	const timeout = 100 * time.Millisecond
	u := serve(t, Config{FirstRequestTimeout: timeout})
	c := dial(t, u)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := c.Write(ctx, websocket.MessageText, []byte(`{"op":"subscribe","id":1}`)); err != nil {
		t.Fatal(err)
	}
	readUntil(t, c, `"type":"ack"`)
	time.Sleep(3 * timeout) // past the deadline: the scenario, not synchronization
	if err := c.Write(ctx, websocket.MessageText, []byte(`{"op":"subscribe","id":2}`)); err != nil {
		t.Fatal(err)
	}
	readUntil(t, c, `"id":2`)
}

// TestRequestFloodIsDroppedThenClosed: requests past the connection's
// bucket are answered with rate_limit_exceeded, saying when the bucket has
// a token again in seconds and milliseconds that agree, and not carried
// out; a client that keeps flooding is closed with 1008.
func TestRequestFloodIsDroppedThenClosed(t *testing.T) {
	u := serve(t, Config{RequestRate: 0.001, RequestBurst: 3, MaxBadMessages: 5})
	c := dial(t, u)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	send := func(id int) {
		t.Helper()
		if err := c.Write(ctx, websocket.MessageText, fmt.Appendf(nil, `{"op":"subscribe","id":%d}`, id)); err != nil {
			t.Fatal(err)
		}
	}
	for id := 1; id <= 3; id++ { // the burst
		send(id)
		readUntil(t, c, fmt.Sprintf(`"type":"ack","id":%d`, id))
	}
	send(4)
	var refused struct {
		Message      string `json:"message"`
		RetryAfter   int64  `json:"retry_after"`
		RetryAfterMS int64  `json:"retry_after_ms"`
	}
	b := readUntil(t, c, `"code":"rate_limit_exceeded"`)
	if err := json.Unmarshal(b, &refused); err != nil {
		t.Fatal(err)
	}
	// A token comes every 1000 s, and the burst was spent just now.
	if ms := refused.RetryAfterMS; refused.Message == "" || ms <= 900_000 || ms > 1_000_000 ||
		refused.RetryAfter*1000 < ms || ms <= (refused.RetryAfter-1)*1000 {
		t.Fatalf("%s: want a message and a wait of (900, 1000] s, in seconds and milliseconds that agree", b)
	}
	for id := 5; id <= 8; id++ { // four more refusals: five in a row
		send(id)
	}
	var err error
	for err == nil {
		var b []byte
		if _, b, err = c.Read(ctx); strings.Contains(string(b), `"type":"ack"`) {
			t.Fatalf("a request over the limit was carried out: %s", b)
		}
	}
	var ce websocket.CloseError
	if !errors.As(err, &ce) || ce.Code != websocket.StatusPolicyViolation || ce.Reason != "requests too fast" {
		t.Fatalf("want close 1008 \"requests too fast\", got %v", err)
	}
}

// TestPongsOfTheNodesPingsAreNotBudgeted: a client answers each heartbeat's
// ping with a pong, which the node asked for, so a heartbeat interval
// shorter than the control-frame budget allows does not close it.
func TestPongsOfTheNodesPingsAreNotBudgeted(t *testing.T) {
	_, addr := serveHub(t, hub.Config{HeartbeatInterval: 20 * time.Millisecond}, Config{ControlFrames: 1})
	c := dial(t, "ws://"+addr)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := c.Write(ctx, websocket.MessageText, []byte(`{"op":"subscribe","id":1}`)); err != nil {
		t.Fatal(err)
	}
	readUntil(t, c, `"type":"ack"`)
	// Reading answers each ping; 30 heartbeats are 30 pongs, far past a
	// budget of 1 a second in bursts of 2.
	for range 30 {
		readUntil(t, c, `"type":"heartbeat"`)
	}
}
