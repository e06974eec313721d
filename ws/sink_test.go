package ws

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/pushd/pushd/hub"
	"github.com/pushd/pushd/internal/testenv"
	"github.com/pushd/pushd/snapshot"
	"github.com/pushd/pushd/ws/internal/wire"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// pair is a server-side sink and the client end of one real WebSocket over
// loopback.
type pair struct {
	sink   *sink
	client *websocket.Conn
	gone   context.Context // done once the server end is closed
	pongs  chan struct{}   // told of each pong the server takes, if there is room
	writes *atomic.Int64   // writes that reached the backlog writer
}

func newPair(tb testing.TB, timeout time.Duration) *pair {
	tb.Helper()
	return openPair(tb, timeout, false)
}

// openPair is newPair whose client and server agree on compression when
// deflate is set.
func openPair(tb testing.TB, timeout time.Duration, deflate bool) *pair {
	tb.Helper()
	accepted := make(chan *sink, 1)
	pongs := make(chan struct{}, 64)
	writes := new(atomic.Int64)
	gone, ended := context.WithCancel(context.Background())
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s := newSink(Config{ControlFrames: 1000}.WithDefaults(), hub.Config{WriteTimeout: timeout}.WithDefaults())
		err := s.wc.Accept(w, r, wire.Options{
			Subprotocol: Subprotocol,
			Compression: deflate,
			Control: func(op byte, payload []byte) bool {
				if op == wire.OpPong {
					select {
					case pongs <- struct{}{}:
					default:
					}
				}
				return s.onControl(op, payload)
			},
			Writer: func(conn net.Conn) io.Writer { return countedWriter{s.writer(conn), writes} },
		})
		if err != nil {
			return
		}
		accepted <- s
		// The server's reader answers the client's pings, as a
		// connection's readers do, until the connection ends.
		go func() {
			defer ended()
			for {
				if _, _, err := s.wc.Read(context.Background()); err != nil {
					return
				}
			}
		}()
	}))
	tb.Cleanup(srv.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	opts := &websocket.DialOptions{Subprotocols: []string{Subprotocol}}
	if deflate {
		opts.CompressionMode = websocket.CompressionNoContextTakeover
	}
	client, _, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(srv.URL, "http"), opts)
	if err != nil {
		tb.Fatal(err)
	}
	p := &pair{sink: <-accepted, client: client, gone: gone, pongs: pongs, writes: writes}
	tb.Cleanup(func() {
		p.client.CloseNow()
		p.sink.wc.CloseNow()
		<-gone.Done()
	})
	return p
}

// countedWriter counts the writes that reach w: one per write(2) when the
// socket takes them whole.
type countedWriter struct {
	w io.Writer
	n *atomic.Int64
}

func (c countedWriter) Write(p []byte) (int, error) {
	c.n.Add(1)
	return c.w.Write(p)
}

// drain reads and drops every frame the client gets, without allocating,
// until the client is closed; the channel closes when it stops.
func (p *pair) drain() <-chan struct{} {
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, 4096)
		for {
			_, r, err := p.client.Reader(context.Background())
			if err != nil {
				return
			}
			for err == nil {
				_, err = r.Read(buf)
			}
		}
	}()
	return done
}

func taskEvent(tb testing.TB, version int64) hub.Event {
	tb.Helper()
	s, err := snapshot.Parse(fmt.Appendf(nil,
		`{"task_id":"task_a","tenant_id":"t1","project_id":"p1","user_id":"u1","status":"RUNNING","progress":45,"stage":"provider_generating","provider":"veo","model":"veo-3","queue_position":0,"version":%d,"updated_at":1710000000000}`,
		version))
	if err != nil {
		tb.Fatal(err)
	}
	return hub.Event{Kind: hub.KindTask, Snapshot: s}
}

// TestSinkWriteLeavesNoDeadline: the write timeout bounds a backlog only. A
// connection idle for longer than the write timeout must still answer a
// client's ping (the pong is written under the library's reader), and take the next
// batch.
func TestSinkWriteLeavesNoDeadline(t *testing.T) {
	const timeout = 50 * time.Millisecond
	p := newPair(t, timeout)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := p.sink.Write([]hub.Event{taskEvent(t, 1)}); err != nil {
		t.Fatal(err)
	}
	if _, data, err := p.client.Read(ctx); err != nil || !strings.Contains(string(data), `"version":1`) {
		t.Fatalf("first frame: %q, %v", data, err)
	}
	time.Sleep(2 * timeout) // idle past the batch's deadline: the scenario, not synchronization
	// The client reads in the background so its Ping sees the pong.
	readErr := make(chan error, 1)
	frames := make(chan []byte, 1)
	go func() {
		_, data, err := p.client.Read(ctx)
		frames <- data
		readErr <- err
	}()
	if err := p.client.Ping(ctx); err != nil {
		t.Fatalf("ping after an idle spell longer than the write timeout: %v", err)
	}
	if _, err := p.sink.Write([]hub.Event{taskEvent(t, 2)}); err != nil {
		t.Fatalf("write after an idle spell: %v", err)
	}
	if data := <-frames; !strings.Contains(string(data), `"version":2`) {
		t.Fatalf("second frame: %q, %v", data, <-readErr)
	}
}

// TestSinkQueuesForStalledPeer: a client that stops reading never holds the
// caller of Write (a hub writer shared with other clients). Once the
// kernel's buffers are full the sink reports the write queued, and a
// backlog the client does not take within the write timeout closes the
// connection, after which writes fail.
func TestSinkQueuesForStalledPeer(t *testing.T) {
	p := newPair(t, 100*time.Millisecond)
	batch := make([]hub.Event, 256)
	for i := range batch {
		batch[i] = taskEvent(t, int64(i+1))
	}
	// Writing goes on after the first queued write: a write can be queued
	// while loopback is still moving bytes to the client's receive buffer
	// (a busy machine), and such a backlog drains in time. Only once both
	// buffers are full does one outlive the timeout and fail.
	queued := false
	for i := 0; i < 2_000 && p.gone.Err() == nil; i++ { // ~130 MB at most: far past any socket buffer
		q, err := p.sink.Write(batch)
		if err != nil {
			if !queued {
				t.Fatalf("write %d failed before anything was queued: %v", i, err)
			}
			break // the backlog outlived the timeout
		}
		queued = queued || q
	}
	if !queued {
		t.Fatal("writes to a client that reads nothing were never queued")
	}
	select {
	case <-p.gone.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the connection was not closed after its backlog outlived the write timeout")
	}
	if _, err := p.sink.Write(batch); err == nil {
		t.Fatal("a write after the backlog failed succeeded")
	}
}

// BenchmarkSinkWrite is one task frame written to one WebSocket client over
// loopback (the client reads on another goroutine): the transport's cost of
// a delivery.
func BenchmarkSinkWrite(b *testing.B) {
	p := newPair(b, 10*time.Second)
	done := p.drain()
	events := []hub.Event{taskEvent(b, 1)}
	events[0].Snapshot.Encoded(snapshot.EncodingWebSocket, taskFrame) // encoded once per version, as in the hub
	b.ReportAllocs()
	for b.Loop() {
		if _, err := p.sink.Write(events); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	p.client.CloseNow()
	<-done
}

// BenchmarkSinkWriteBatch is eight task frames written to one WebSocket
// client in one Write, as a connection watching several tasks gets them
// after a busy spell: what one turn of a hub writer costs the transport.
func BenchmarkSinkWriteBatch(b *testing.B) {
	p := newPair(b, 10*time.Second)
	done := p.drain()
	events := make([]hub.Event, 8)
	for i := range events {
		events[i] = taskEvent(b, int64(i+1))
		events[i].Snapshot.Encoded(snapshot.EncodingWebSocket, taskFrame)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := p.sink.Write(events); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	p.client.CloseNow()
	<-done
}
