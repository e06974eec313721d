package node_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/pushd/pushd/hub"
	"github.com/pushd/pushd/internal/testenv"
)

// TestStalledReadersCostOnlyThemselves: many more clients that stop reading
// than the hub has writers, SSE and WebSocket, beside healthy clients of
// both. The healthy ones get every change while the stalled ones are still
// connected (nobody waited for a stalled socket), the stalled ones are cut
// once their backlog outlives the write timeout, and when everyone is gone
// the node holds no more goroutines or memory than before.
func TestStalledReadersCostOnlyThemselves(t *testing.T) {
	c := newCluster(t)
	cfg := c.config()
	cfg.Hub.Writers = 4
	// The healthy clients converge in well under a second; the stalled are
	// cut after this, and the assertions below tell the two apart.
	cfg.Hub.WriteTimeout = 8 * time.Second
	// The send buffer a node has by default: left to the kernel's
	// autotuning, a socket holds up to 4 MB, more than the node writes to a
	// stalled client when it conflates most versions, and then none stalls.
	cfg.Hub.SendBuffer = hub.DefaultSendBuffer
	s := startNode(t, cfg)

	// The healthy clients watch small tasks; the stalled watch those and big
	// ones, whose changes fill their sockets.
	const tasks, big, healthySSE, healthyWS, stalledSSE, stalledWS, rounds = 10, 10, 50, 50, 16, 16, 12
	ids := make([]string, tasks)
	query := make([]string, tasks)
	for i := range ids {
		ids[i] = testenv.UniqueID("task")
		query[i] = "task=" + ids[i]
		c.goPublish(t, doc(ids[i], "t1", 1, "RUNNING"))
	}
	bigIDs := make([]string, big)
	for i := range bigIDs {
		bigIDs[i] = testenv.UniqueID("task")
		c.goPublish(t, doc(bigIDs[i], "t1", 1, "RUNNING"))
	}
	stalledQuery := append([]string(nil), query...)
	for _, id := range bigIDs {
		stalledQuery = append(stalledQuery, "task="+id)
	}
	tok := token(t, "t1", "u1")
	// Warm the node's own goroutines (bus, reaper) before the baseline.
	warm := openSSE(t, s.URL, tok, query[0])
	warm.nextTask(t)
	warm.Close()
	testenv.Eventually(t, "the warm-up stream closed", func() bool { return s.Hub().Len() == 0 })
	baseGoroutines, baseHeap := runtime.NumGoroutine(), heapInUse()

	// The healthy clients are dropped once closed, so what the test itself
	// holds does not hide what the node holds.
	ok := make([]*healthyClient, 0, healthySSE+healthyWS)
	for i := range healthySSE {
		ok = append(ok, healthySSEClient(t, s.URL, tok, ids[i%tasks]))
	}
	for i := range healthyWS {
		ok = append(ok, healthyWSClient(t, s.URL, tok, ids[i%tasks]))
	}
	var stalled []net.Conn
	for range stalledSSE {
		stalled = append(stalled, stalledSSEConn(t, s.URL, tok, stalledQuery))
	}
	for range stalledWS {
		stalled = append(stalled, stalledWSConn(t, s.URL, tok, append(ids[:tasks:tasks], bigIDs...)))
	}
	for _, h := range ok {
		if v := h.next(t); v != 1 {
			t.Fatalf("initial version %d, want 1", v)
		}
	}
	all := healthySSE + healthyWS + stalledSSE + stalledWS
	testenv.Eventually(t, "every client connected", func() bool { return s.Hub().Len() == all })

	// Each round offers every stalled client 600 KB more than the healthy
	// ones get, far past what socket buffers hold within a few rounds.
	pad := strings.Repeat("x", 60<<10)
	for v := int64(2); v <= rounds; v++ {
		for _, id := range bigIDs {
			c.goPublish(t, strings.Replace(doc(id, "t1", v, "RUNNING"), `"x_custom"`, `"pad":"`+pad+`","x_custom"`, 1))
		}
		for _, id := range ids {
			c.goPublish(t, doc(id, "t1", v, "RUNNING"))
		}
	}
	lastPublish := time.Now()
	for _, h := range ok {
		for v := int64(0); v != rounds; {
			got := h.next(t)
			if got <= v {
				t.Fatalf("task %s: version %d after %d", h.task, got, v)
			}
			v = got
		}
	}
	converged := time.Since(lastPublish)
	st := s.Hub().Stats()
	if n, we := s.Hub().Len(), st.Cuts[hub.CutWriteFailed]; n != all || we != 0 {
		t.Fatalf("when the healthy clients had every change (%v after the last publish): %d of %d connections, %d write errors; "+
			"stalled clients were cut first, so the healthy ones waited for them", converged, n, all, we)
	}
	if b := st.Backlogged; b < stalledSSE+stalledWS {
		t.Fatalf("%d writes queued behind full sockets, want at least one per stalled client (%d): the clients did not stall, so the test proves nothing",
			b, stalledSSE+stalledWS)
	}
	t.Logf("healthy clients converged %v after the last publish; %d writes queued for stalled clients", converged, st.Backlogged)
	if got := testenv.Scrape(t, s.AdminURL)["pushd_writes_backlogged_total"]; got < stalledSSE+stalledWS {
		t.Fatalf("pushd_writes_backlogged_total %v, want at least %d", got, stalledSSE+stalledWS)
	}
	http.DefaultClient.CloseIdleConnections() // the scrape's keep-alive connection is not the node's to count

	// The stalled are cut once their backlog outlives the write timeout.
	// Changes keep coming, as they would: with none, what a stalled client
	// was sent could all fit in its socket's buffers, and only the next
	// heartbeat would find it full.
	v := int64(rounds)
	testenv.EventuallyWithin(t, "the stalled clients cut", 3*cfg.Hub.WriteTimeout, func() bool {
		v++
		for _, id := range bigIDs {
			c.goPublish(t, strings.Replace(doc(id, "t1", v, "RUNNING"), `"x_custom"`, `"pad":"`+pad+`","x_custom"`, 1))
		}
		return s.Hub().Len() == healthySSE+healthyWS && s.Hub().Stats().Cuts[hub.CutWriteFailed] >= stalledSSE+stalledWS
	})
	t.Logf("stalled clients cut %v after the last publish", time.Since(lastPublish))
	for _, conn := range stalled {
		conn.Close()
	}
	for _, h := range ok {
		h.close()
	}
	ok, stalled = nil, nil
	testenv.Eventually(t, "every connection closed", func() bool { return s.Hub().Len() == 0 })
	testenv.Eventually(t, "goroutines back to the baseline", func() bool { return runtime.NumGoroutine() <= baseGoroutines+2 })
	// Every stalled client had 600 KB or more queued, 19 MB if that leaked;
	// the store's cache of the newest snapshots and the pools' connections
	// (3 to 5 MB here) are the node's to keep.
	const slack = 8 << 20
	var heap uint64
	testenv.Eventually(t, "memory back to the baseline", func() bool { heap = heapInUse(); return heap <= baseHeap+slack })
	t.Logf("heap in use: %d KB before the clients, %d KB after", baseHeap>>10, heap>>10)
}

// healthyClient reads the versions of one task as they arrive.
type healthyClient struct {
	task  string
	next  func(*testing.T) int64
	close func()
}

// healthySSEClient reads an SSE stream on a bare socket.
func healthySSEClient(t *testing.T, base, tok, task string) *healthyClient {
	t.Helper()
	conn, err := net.Dial("tcp", strings.TrimPrefix(base, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(conn, "GET /v1/events?task=%s HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\n\r\n", task, tok)
	br := bufio.NewReader(conn)
	next := func(t *testing.T) int64 {
		t.Helper()
		conn.SetReadDeadline(time.Now().Add(waitFor))
		for {
			line, err := br.ReadString('\n')
			if err != nil {
				t.Fatalf("SSE stream of %s: %v", task, err)
			}
			if data, ok := strings.CutPrefix(line, "data: "); ok && strings.Contains(data, `"task_id"`) {
				return parseDoc(t, data).Version
			}
		}
	}
	return &healthyClient{task, next, func() { conn.Close() }}
}

// healthyWSClient subscribes to task over a WebSocket.
func healthyWSClient(t *testing.T, base, tok, task string) *healthyClient {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	wc, _, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(base, "http")+"/v1/ws?access_token="+tok,
		&websocket.DialOptions{Subprotocols: []string{"pushd.v1"}})
	if err != nil {
		t.Fatal(err)
	}
	if err := wc.Write(ctx, websocket.MessageText, fmt.Appendf(nil, `{"op":"subscribe","id":1,"tasks":[%q]}`, task)); err != nil {
		t.Fatal(err)
	}
	next := func(t *testing.T) int64 {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), waitFor)
		defer cancel()
		for {
			_, b, err := wc.Read(ctx)
			if err != nil {
				t.Fatalf("WebSocket of %s: %v", task, err)
			}
			var m struct {
				Type string          `json:"type"`
				Task json.RawMessage `json:"task"`
			}
			if json.Unmarshal(b, &m) == nil && m.Type == "task" {
				return parseDoc(t, string(m.Task)).Version
			}
		}
	}
	return &healthyClient{task, next, func() { wc.CloseNow() }}
}

// stalledSSEConn opens an SSE stream for query that reads its response
// headers and nothing more, with a small receive buffer so the server's
// socket fills soon.
func stalledSSEConn(t *testing.T, base, tok string, query []string) net.Conn {
	t.Helper()
	conn, err := smallBufferDialer().Dial("tcp", strings.TrimPrefix(base, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	fmt.Fprintf(conn, "GET /v1/events?%s HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\n\r\n", strings.Join(query, "&"), tok)
	buf := make([]byte, 12)
	if _, err := conn.Read(buf); err != nil || string(buf) != "HTTP/1.1 200" {
		t.Fatalf("stalled SSE client: %q, %v", buf, err)
	}
	return conn
}

// stalledWSConn opens a WebSocket that subscribes to tasks and never reads
// again, with a small receive buffer.
func stalledWSConn(t *testing.T, base, tok string, tasks []string) net.Conn {
	t.Helper()
	var conn net.Conn
	d := smallBufferDialer()
	client := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := d.DialContext(ctx, network, addr)
		conn = c
		return c, err
	}}}
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	u := "ws" + strings.TrimPrefix(base, "http") + "/v1/ws?access_token=" + tok
	wc, _, err := websocket.Dial(ctx, u, &websocket.DialOptions{Subprotocols: []string{"pushd.v1"}, HTTPClient: client})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { wc.CloseNow() })
	b := fmt.Appendf(nil, `{"op":"subscribe","id":1,"tasks":["%s"]}`, strings.Join(tasks, `","`))
	if err := wc.Write(ctx, websocket.MessageText, b); err != nil {
		t.Fatal(err)
	}
	return conn
}

func smallBufferDialer() *net.Dialer {
	return &net.Dialer{Control: func(_, _ string, rc syscall.RawConn) error {
		return rc.Control(func(fd uintptr) { syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096) })
	}}
}

func heapInUse() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapInuse
}

// TestStreamsOutliveTheWriteTimeout: the write timeout bounds a backlog,
// not a stream's life. A deadline left on the socket by the stream's first
// write would fail every write after it once it passed.
func TestStreamsOutliveTheWriteTimeout(t *testing.T) {
	c := newCluster(t)
	cfg := c.config()
	cfg.Hub.WriteTimeout = 300 * time.Millisecond
	s := startNode(t, cfg)
	task := testenv.UniqueID("task")
	c.goPublish(t, doc(task, "t1", 1, "RUNNING"))
	tok := token(t, "t1", "u1")
	sse := healthySSEClient(t, s.URL, tok, task)
	defer sse.close()
	ws := healthyWSClient(t, s.URL, tok, task)
	defer ws.close()
	for _, h := range []*healthyClient{sse, ws} {
		if v := h.next(t); v != 1 {
			t.Fatalf("initial version %d", v)
		}
	}
	time.Sleep(3 * cfg.Hub.WriteTimeout) // the streams outlive the timeout: the scenario, not synchronization
	c.goPublish(t, doc(task, "t1", 2, "RUNNING"))
	for name, h := range map[string]*healthyClient{"SSE": sse, "WebSocket": ws} {
		if v := h.next(t); v != 2 {
			t.Fatalf("%s: version %d after the write timeout passed, want 2", name, v)
		}
	}
	if we := s.Hub().Stats().Cuts[hub.CutWriteFailed]; we != 0 {
		t.Fatalf("%d write errors on streams whose clients read everything", we)
	}
}
