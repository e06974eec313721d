//go:build !race

// The race detector changes what allocates, so allocation guards run
// without it: scripts/test runs them in a step of their own.

package ws

import (
	"testing"
	"time"

	"github.com/pushd/pushd/hub"
	"github.com/pushd/pushd/snapshot"
)

// TestSteadyStateWriteDoesNotAllocate guards the WebSocket half of a
// delivery: writing an already encoded task frame to a connection, plain
// or compressed. The client reads on another goroutine without allocating,
// so any allocation counted is the server's.
func TestSteadyStateWriteDoesNotAllocate(t *testing.T) {
	for _, deflate := range []bool{false, true} {
		p := openPair(t, 10*time.Second, deflate)
		done := p.drain()
		events := []hub.Event{taskEvent(t, 1)}
		for range 100 { // encode the version, warm the client's reader and the runtime's poller
			if _, err := p.sink.Write(events); err != nil {
				t.Fatal(err)
			}
		}
		allocs := testing.AllocsPerRun(500, func() {
			if _, err := p.sink.Write(events); err != nil {
				t.Fatal(err)
			}
		})
		p.client.CloseNow()
		<-done
		if allocs > 0 {
			t.Errorf("writing a task frame (compressed: %v) allocated %.2f times per write; want 0", deflate, allocs)
		}
	}
}

// TestBatchWriteDoesNotAllocate: several frames in one Write, collected in
// a pooled buffer and written at once, allocate nothing either.
func TestBatchWriteDoesNotAllocate(t *testing.T) {
	p := newPair(t, 10*time.Second)
	done := p.drain()
	events := make([]hub.Event, 8)
	for i := range events {
		events[i] = taskEvent(t, int64(i+1))
		events[i].Snapshot.Encoded(snapshot.EncodingWebSocket, taskFrame)
	}
	for range 100 {
		if _, err := p.sink.Write(events); err != nil {
			t.Fatal(err)
		}
	}
	allocs := testing.AllocsPerRun(500, func() {
		if _, err := p.sink.Write(events); err != nil {
			t.Fatal(err)
		}
	})
	p.client.CloseNow()
	<-done
	if allocs > 0 {
		t.Fatalf("writing %d task frames allocated %.2f times per write; want 0", len(events), allocs)
	}
}
