//go:build !race

// The race detector changes what allocates, so allocation guards run
// without it: scripts/test runs them in a step of their own.

package ws

import (
	"testing"
	"time"

	"github.com/pushd/pushd/hub"
)

// TestSteadyStateWriteDoesNotAllocate guards the WebSocket half of a
// delivery: writing already encoded task frames to a connection, one or
// eight in a Write (collected in a pooled buffer and written at once),
// plain or compressed. The client reads on another goroutine without
// allocating, so any allocation counted is the server's.
func TestSteadyStateWriteDoesNotAllocate(t *testing.T) {
	for _, tc := range []struct {
		frames  int
		deflate bool
	}{{1, false}, {1, true}, {8, false}, {8, true}} {
		p := openPair(t, 10*time.Second, tc.deflate)
		done := p.drain()
		events := make([]hub.Event, tc.frames)
		for i := range events {
			events[i] = taskEvent(t, int64(i+1))
		}
		for range 100 { // encode the versions, warm the client's reader and the runtime's poller
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
			t.Errorf("writing %d task frames (compressed: %v) allocated %.2f times per write; want 0", tc.frames, tc.deflate, allocs)
		}
	}
}
