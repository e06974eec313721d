package node_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/pushd/pushd/auth"
	"github.com/pushd/pushd/internal/testenv"
	"github.com/pushd/pushd/node"
	"github.com/pushd/pushd/snapshot"
)

var testSecret = []byte("node-test-secret-0123456789abcdef")

const waitFor = 10 * time.Second

// server is a node listening on a real socket.
type server struct {
	*node.Node
	URL      string
	AdminURL string // the admin listener's: /metrics
}

// Options every test node gets before its own: tests wait for cleanups and
// for lost subscriptions to be noticed, which production checks every 5s
// and every 1s.
const (
	testDisconnectCheck = 100 * time.Millisecond
	testLiveness        = 200 * time.Millisecond
)

func startNode(t *testing.T, cfg node.Config, opts ...node.Option) *server {
	t.Helper()
	if cfg.JWTSecret == nil && cfg.JWTPublicKeyPEM == nil && !cfg.Embedded() {
		cfg.JWTSecret = testSecret
	}
	if cfg.NodeName == "" {
		cfg.NodeName = "node-" + testenv.RandomSuffix(2)
	}
	if cfg.SSE.CheckInterval == 0 {
		cfg.SSE.CheckInterval = testDisconnectCheck
	}
	opts = append([]node.Option{node.ForTest(node.TestTuning{LivenessInterval: testLiveness})}, opts...)
	n, err := node.New(context.Background(), cfg, opts...)
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	al, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served, adminServed := make(chan error, 1), make(chan error, 1)
	go func() { served <- n.Serve(l) }()
	go func() { adminServed <- n.ServeAdmin(al) }()
	admin := "http://" + al.Addr().String()
	t.Cleanup(func() {
		if t.Failed() {
			logDeliveryState(t, admin)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		n.Shutdown(ctx)
		if err := <-served; err != nil {
			t.Errorf("serve: %v", err)
		}
		if err := <-adminServed; err != nil {
			t.Errorf("serve admin: %v", err)
		}
	})
	return &server{Node: n, URL: "http://" + l.Addr().String(), AdminURL: admin}
}

// logDeliveryState logs what a failed test's node says of the paths a
// change takes to a client (its mode, the bus, the repair and poll rounds),
// so that a failure seen once tells which of them stalled. It never fails
// the test itself: the node may be what broke.
func logDeliveryState(t *testing.T, admin string) {
	t.Helper()
	resp, err := http.Get(admin + "/metrics")
	if err != nil {
		t.Logf("the node's metrics at the failure: %v", err)
		return
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	var lines []string
	for line := range strings.SplitSeq(string(body), "\n") {
		for _, p := range []string{"pushd_mode", "pushd_polling_tenants", "pushd_polls", "pushd_poll_errors", "pushd_resyncs",
			"pushd_pubsub_failures", "pushd_pubsub_received", "pushd_pubsub_subscription", "pushd_liveness_", "pushd_repair", "pushd_notifications_total", "pushd_connections ", "pushd_deliveries_total", "pushd_resume", "pushd_stream"} {
			if strings.HasPrefix(line, p) && !strings.Contains(line, "_bucket") {
				lines = append(lines, line)
				break
			}
		}
	}
	t.Logf("the node at the failure:\n%s", strings.Join(lines, "\n"))
}

func token(t testing.TB, tenant, user string) string {
	t.Helper()
	return tokenExp(t, tenant, user, time.Now().Add(time.Hour))
}

// tokenExp signs a token granted every project of its tenant: the tests
// that are not about grants watch other users' tasks too (grant_test.go
// is about them).
func tokenExp(t testing.TB, tenant, user string, exp time.Time) string {
	t.Helper()
	tok, err := auth.NewSigner(testSecret).Sign(auth.Principal{TenantID: tenant, UserID: user, ExpiresAt: exp, Grant: &snapshot.Grant{All: true}})
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

func doc(task, tenant string, version int64, status string) string {
	return fmt.Sprintf(`{"task_id":%q,"tenant_id":%q,"project_id":"p1","user_id":"u1","status":%q,"progress":%d,"stage":"provider_generating","provider":"veo","model":"veo-3","queue_position":null,"preview_asset_id":null,"output_asset_id":null,"error_code":null,"version":%d,"updated_at":1710000000000,"x_custom":{"kept":true}}`,
		task, tenant, status, version%101, version)
}

func parseDoc(t testing.TB, s string) *snapshot.Snapshot {
	t.Helper()
	snap, err := snapshot.Parse([]byte(s))
	if err != nil {
		t.Fatal(err)
	}
	return snap
}

// sseEvent is one dispatched Server-Sent Event.
type sseEvent = testenv.SSEEvent

// sseClient is testenv's, with this package's ways of reading it.
type sseClient struct{ *testenv.SSEClient }

// openSSE opens GET /v1/events?query with a bearer token ("" for none).
func openSSE(t *testing.T, base, tok, query string, header ...string) *sseClient {
	t.Helper()
	if tok != "" {
		header = append(header, "Authorization", "Bearer "+tok)
	}
	return &sseClient{testenv.OpenSSE(t, nil, base+"/v1/events?"+query, header...)}
}

func (c *sseClient) nextTask(t *testing.T) *snapshot.Snapshot {
	t.Helper()
	return parseDoc(t, c.NextOf(t, "task").Data)
}

// wsClient is a WebSocket client over a real socket.
type wsClient struct {
	conn   *websocket.Conn
	msgs   chan map[string]json.RawMessage
	err    error // the read error that ended msgs
	cancel context.CancelFunc
	done   chan struct{}
	once   sync.Once
}

func dialWS(t *testing.T, base, tok string, opts *websocket.DialOptions) (*wsClient, *http.Response, error) {
	t.Helper()
	return dialWSQuery(t, base, tok, url.Values{}, opts)
}

// dialWSQuery is dialWS with more of /v1/ws's query.
func dialWSQuery(t *testing.T, base, tok string, q url.Values, opts *websocket.DialOptions) (*wsClient, *http.Response, error) {
	t.Helper()
	if opts == nil {
		opts = &websocket.DialOptions{Subprotocols: []string{"pushd.v1"}}
	}
	if tok != "" {
		q.Set("access_token", tok)
	}
	u := "ws" + strings.TrimPrefix(base, "http") + "/v1/ws"
	if len(q) > 0 {
		u += "?" + q.Encode()
	}
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	conn, resp, err := websocket.Dial(ctx, u, opts)
	if err != nil {
		return nil, resp, err
	}
	rctx, rcancel := context.WithCancel(context.Background())
	c := &wsClient{conn: conn, msgs: make(chan map[string]json.RawMessage, 1024), cancel: rcancel, done: make(chan struct{})}
	go func() {
		defer close(c.done)
		defer close(c.msgs)
		for {
			_, b, err := conn.Read(rctx)
			if err != nil {
				c.err = err
				return
			}
			var m map[string]json.RawMessage
			if err := json.Unmarshal(b, &m); err != nil {
				c.err = fmt.Errorf("server sent invalid JSON %q: %w", b, err)
				return
			}
			c.msgs <- m
		}
	}()
	t.Cleanup(c.Close)
	return c, resp, nil
}

func openWS(t *testing.T, base, tok string) *wsClient {
	t.Helper()
	c, _, err := dialWS(t, base, tok, nil)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func (c *wsClient) Close() {
	c.once.Do(func() {
		c.conn.CloseNow()
		c.cancel()
		<-c.done
	})
}

func (c *wsClient) send(t *testing.T, v any) {
	t.Helper()
	b, _ := json.Marshal(v)
	c.sendRaw(t, websocket.MessageText, b)
}

func (c *wsClient) sendRaw(t *testing.T, typ websocket.MessageType, b []byte) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	if err := c.conn.Write(ctx, typ, b); err != nil {
		t.Fatal(err)
	}
}

func msgType(m map[string]json.RawMessage) string {
	var s string
	json.Unmarshal(m["type"], &s)
	return s
}

// Next returns the next message other than hello, mode and heartbeat.
func (c *wsClient) Next(t *testing.T) map[string]json.RawMessage {
	t.Helper()
	timer := time.NewTimer(waitFor)
	defer timer.Stop()
	for {
		select {
		case m, ok := <-c.msgs:
			if !ok {
				t.Fatalf("WebSocket ended: %v", c.err)
			}
			if typ := msgType(m); typ == "hello" || typ == "mode" || typ == "heartbeat" {
				continue
			}
			return m
		case <-timer.C:
			t.Fatal("no WebSocket message within", waitFor)
		}
	}
}

// nextAny returns the next message, whatever its type.
func (c *wsClient) nextAny(t *testing.T) map[string]json.RawMessage {
	t.Helper()
	select {
	case m, ok := <-c.msgs:
		if !ok {
			t.Fatalf("WebSocket ended: %v", c.err)
		}
		return m
	case <-time.After(waitFor):
		t.Fatal("no WebSocket message within", waitFor)
		return nil
	}
}

func (c *wsClient) NextOf(t *testing.T, typ string) map[string]json.RawMessage {
	t.Helper()
	m := c.Next(t)
	if got := msgType(m); got != typ {
		t.Fatalf("got %q message %v, want %q", got, rawString(m), typ)
	}
	return m
}

func (c *wsClient) nextTask(t *testing.T) *snapshot.Snapshot {
	t.Helper()
	return parseDoc(t, string(c.NextOf(t, "task")["task"]))
}

// closeStatus waits for the server to close the connection and returns its
// close code.
func (c *wsClient) closeStatus(t *testing.T) websocket.StatusCode {
	t.Helper()
	timer := time.NewTimer(waitFor)
	defer timer.Stop()
	for {
		select {
		case _, ok := <-c.msgs:
			if !ok {
				return websocket.CloseStatus(c.err)
			}
		case <-timer.C:
			t.Fatal("WebSocket not closed within", waitFor)
		}
	}
}

func rawString(m map[string]json.RawMessage) string {
	b, _ := json.Marshal(m)
	return string(b)
}

// httpJSON does a request and decodes a JSON answer into out (when not nil).
func httpDo(t *testing.T, method, u, tok, body string, header ...string) (*http.Response, []byte) {
	t.Helper()
	req, _ := http.NewRequest(method, u, strings.NewReader(body))
	if tok != "" {
		req.Header.Set("Authorization", "Bearer "+tok)
	}
	for i := 0; i+1 < len(header); i += 2 {
		if header[i] == "Host" { // net/http sends req.Host, never a Host header
			req.Host = header[i+1]
			continue
		}
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, b
}

// wantError checks a JSON error answer.
func wantError(t *testing.T, resp *http.Response, body []byte, status int, code string) {
	t.Helper()
	if resp.StatusCode != status {
		t.Fatalf("status %d (%s), want %d", resp.StatusCode, body, status)
	}
	var e struct{ Error, Message string }
	if err := json.Unmarshal(body, &e); err != nil || e.Error != code || e.Message == "" {
		t.Fatalf("body %s, want a JSON error with code %q and a message", body, code)
	}
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
		t.Fatalf("Content-Type %q", ct)
	}
}

func base64URL(b []byte) string { return base64.URLEncoding.EncodeToString(b) }
