//go:build !race

// The race detector changes what allocates (sync.Pool drops items on
// purpose), so allocation guards run without it: scripts/test runs them in
// a step of their own.

package sse

import (
	"fmt"
	"io"
	"net"
	"testing"
	"time"

	"github.com/pushd/pushd/hub"
	"github.com/pushd/pushd/internal/backlog"
	"github.com/pushd/pushd/snapshot"
)

// TestSteadyStateWriteDoesNotAllocate guards the SSE half of the delivery
// path: rendering a task event with its cursor and writing it to a real
// socket. Once the connection has seen the task, a new version must not
// allocate.
func TestSteadyStateWriteDoesNotAllocate(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	drained := make(chan struct{})
	go func() {
		defer close(drained)
		c, err := l.Accept()
		if err != nil {
			return
		}
		io.Copy(io.Discard, c)
		c.Close()
	}()
	conn, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	s := &hijackedSink{conn: conn, w: backlog.New(conn, 10*time.Second, func(error) {}), enc: encoder{retry: 2000}}
	snaps := make([]*snapshot.Snapshot, 300)
	for i := range snaps {
		var err error
		snaps[i], err = snapshot.Parse(fmt.Appendf(nil, `{"task_id":"task_a","tenant_id":"t1","status":"RUNNING","version":%d}`, i+1))
		if err != nil {
			t.Fatal(err)
		}
	}
	events := make([]hub.Event, 1)
	next := 0
	write := func() {
		events[0] = hub.Event{Kind: hub.KindTask, Snapshot: snaps[next]}
		next++
		if _, err := s.Write(events); err != nil {
			t.Fatal(err)
		}
	}
	for range 10 {
		write()
	}
	if allocs := testing.AllocsPerRun(200, write); allocs > 0 {
		t.Fatalf("%.1f allocations per task event written, want 0", allocs)
	}
	conn.Close()
	<-drained
}
