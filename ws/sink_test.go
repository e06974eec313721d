package ws

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/pushd/pushd/hub"
	"github.com/pushd/pushd/snapshot"
	"github.com/pushd/pushd/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// pair is a server-side sink and the client end of one real WebSocket over
// loopback.
type pair struct {
	sink   *sink
	client *websocket.Conn
}

func newPair(tb testing.TB, timeout time.Duration) *pair {
	tb.Helper()
	accepted := make(chan *sink, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var nc net.Conn
		wc, err := websocket.Accept(smallBuffers{w, &nc}, r, &websocket.AcceptOptions{Subprotocols: []string{Subprotocol}})
		if err != nil {
			return
		}
		// The server's reader answers the client's pings, as run does.
		wc.CloseRead(context.Background())
		accepted <- &sink{wc: wc, nc: nc, timeout: timeout}
	}))
	tb.Cleanup(srv.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	client, _, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(srv.URL, "http"), &websocket.DialOptions{Subprotocols: []string{Subprotocol}})
	if err != nil {
		tb.Fatal(err)
	}
	p := &pair{sink: <-accepted, client: client}
	tb.Cleanup(func() {
		p.client.CloseNow()
		p.sink.wc.CloseNow()
	})
	return p
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

// TestSinkWriteLeavesNoDeadline: the write deadline bounds a batch only. A
// connection idle for longer than the write timeout must still answer a
// client's ping (coder/websocket writes the pong itself, with no deadline of
// its own), and take the next batch.
func TestSinkWriteLeavesNoDeadline(t *testing.T) {
	const timeout = 50 * time.Millisecond
	p := newPair(t, timeout)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := p.sink.Write([]hub.Event{taskEvent(t, 1)}); err != nil {
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
	if err := p.sink.Write([]hub.Event{taskEvent(t, 2)}); err != nil {
		t.Fatalf("write after an idle spell: %v", err)
	}
	if data := <-frames; !strings.Contains(string(data), `"version":2`) {
		t.Fatalf("second frame: %q, %v", data, <-readErr)
	}
}

// TestSinkWriteTimesOutOnStalledPeer: a client that stops reading fails the
// writes once the kernel's buffers are full, within the write timeout, so
// the hub can close it as a slow client instead of a writer hanging on it.
func TestSinkWriteTimesOutOnStalledPeer(t *testing.T) {
	p := newPair(t, 100*time.Millisecond)
	batch := make([]hub.Event, 256)
	for i := range batch {
		batch[i] = taskEvent(t, int64(i+1))
	}
	var err error
	for i := 0; i < 10_000 && err == nil; i++ { // ~100 MB at most: far past any socket buffer
		err = p.sink.Write(batch)
	}
	if err == nil {
		t.Fatal("writes to a client that reads nothing never failed")
	}
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("want a deadline error, got %v", err)
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
		if err := p.sink.Write(events); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	p.client.CloseNow()
	<-done
}
