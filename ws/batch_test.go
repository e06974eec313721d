package ws

import (
	"context"
	"io"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pushd/pushd/hub"
)

// countingWriter counts the writes that reach the backlog writer: one per
// write(2) when the socket takes them whole.
type countingWriter struct {
	w  io.Writer
	mu sync.Mutex
	n  int
}

func (c *countingWriter) Write(p []byte) (int, error) {
	c.mu.Lock()
	c.n++
	c.mu.Unlock()
	return c.w.Write(p)
}

func (c *countingWriter) writes() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n
}

func countWrites(p *pair) *countingWriter {
	p.sink.out.mu.Lock()
	defer p.sink.out.mu.Unlock()
	cw := &countingWriter{w: p.sink.out.w}
	p.sink.out.w = cw
	return cw
}

// readVersions reads n text frames and checks they carry versions 1..n in
// order.
func readVersions(t *testing.T, p *pair, n int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for v := 1; v <= n; v++ {
		_, data, err := p.client.Read(ctx)
		if err != nil {
			t.Fatalf("frame %d: %v", v, err)
		}
		if want := `"version":` + strconv.Itoa(v) + `,`; !strings.Contains(string(data), want) {
			t.Fatalf("frame %d is %q; want %s", v, data, want)
		}
	}
}

// TestSinkWritesSeveralFramesInOneWrite: the frames of one Write reach the
// socket in one write, whole and in order, and a single frame still goes
// out by itself.
func TestSinkWritesSeveralFramesInOneWrite(t *testing.T) {
	p := newPair(t, 10*time.Second)
	cw := countWrites(p)
	events := make([]hub.Event, 8)
	for i := range events {
		events[i] = taskEvent(t, int64(i+1))
	}
	if _, err := p.sink.Write(events); err != nil {
		t.Fatal(err)
	}
	if n := cw.writes(); n != 1 {
		t.Fatalf("a Write of %d frames made %d writes; want 1", len(events), n)
	}
	readVersions(t, p, len(events))

	if _, err := p.sink.Write(events[:1]); err != nil {
		t.Fatal(err)
	}
	if n := cw.writes(); n != 2 {
		t.Fatalf("after a Write of one frame: %d writes; want 2", n)
	}
	readVersions(t, p, 1)
}

// TestBatchCarriesTheLibrarysOwnFrames: a frame coder/websocket writes
// from another goroutine while a batch is open (here a ping) joins the
// batch whole, between the frames written before and after it: the client
// reads both task frames intact and answers the ping.
func TestBatchCarriesTheLibrarysOwnFrames(t *testing.T) {
	p := newPair(t, 10*time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	p.sink.out.open()
	if err := p.sink.writeFrames([]hub.Event{taskEvent(t, 1)}); err != nil {
		t.Fatal(err)
	}
	before := batched(p)
	pinged := make(chan error, 1)
	go func() { pinged <- p.sink.wc.Ping(ctx) }()
	for batched(p) == before {
		if ctx.Err() != nil {
			t.Fatal("the ping never reached the open batch")
		}
		time.Sleep(time.Millisecond) // polling a condition under a deadline
	}
	if err := p.sink.writeFrames([]hub.Event{taskEvent(t, 2)}); err != nil {
		t.Fatal(err)
	}
	if err := p.sink.out.close(); err != nil {
		t.Fatal(err)
	}
	readVersions(t, p, 2) // the client's reader answers the ping meanwhile
	if err := <-pinged; err != nil {
		t.Fatalf("ping sent inside a batch: %v", err)
	}
}

func batched(p *pair) int {
	p.sink.out.mu.Lock()
	defer p.sink.out.mu.Unlock()
	return len(*p.sink.out.batch)
}
