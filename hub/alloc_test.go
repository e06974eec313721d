//go:build !race

// The race detector changes what allocates (sync.Pool drops items on
// purpose), so allocation guards run without it: scripts/test runs them in
// a step of their own.

package hub_test

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/pushd/pushd/fanout"
	"github.com/pushd/pushd/hub"
	"github.com/pushd/pushd/snapshot"
)

// TestSteadyStateDeliveryDoesNotAllocate guards the delivery path: a
// notification for a watched task, the snapshot read, the outbox, the
// writer, the sink. Once a connection has delivered a task, delivering its
// next version must not allocate (the snapshot itself is the publisher's).
func TestSteadyStateDeliveryDoesNotAllocate(t *testing.T) {
	store := &seqSource{MemoryStore: snapshot.NewMemoryStore()}
	bus := fanout.NewMemoryBus()
	h := hub.New(hub.Config{Source: store, Bus: bus, Writers: 1, Dispatchers: 1})
	bus.Start(h)
	defer bus.Close()
	defer h.Close()
	d := discard{n: make(chan struct{}, 1)}
	c, err := h.Open(hub.Principal{TenantID: "t1", UserID: "u1"}, d)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	const runs = 200
	snaps := make([]*snapshot.Snapshot, runs+20)
	for i := range snaps {
		snaps[i] = snap(t, "t1", "task_a", int64(i+1))
	}
	store.SetIfNewer(context.Background(), snaps[0])
	store.cur.Store(snaps[0])
	if _, err := c.Subscribe(context.Background(), hub.Subscription{Tasks: []string{"task_a"}}); err != nil {
		t.Fatal(err)
	}
	<-d.n
	next := 1
	deliver := func() {
		s := snaps[next]
		next++
		store.cur.Store(s)
		h.Notify(snapshot.Notification{TenantID: "t1", TaskID: "task_a", Version: s.Version})
		<-d.n
	}
	for range 10 { // warm up: maps and slices reach their steady size
		deliver()
	}
	if allocs := testing.AllocsPerRun(runs, deliver); allocs > 0 {
		t.Fatalf("%.1f allocations per delivery in the steady state, want 0", allocs)
	}
}

// TestSteadyStateFanoutDoesNotAllocate guards the fan-out of one
// notification to many connections: the index walk, the offers, the run
// queue hand-off (pushAll) and each connection's entry for the task, which
// outlives a write so the next version reuses it.
func TestSteadyStateFanoutDoesNotAllocate(t *testing.T) {
	if allocs := fanoutAllocs(t, false); allocs > 0 {
		t.Fatalf("%.1f allocations per notification to %d connections in the steady state, want 0", allocs, fanoutConns)
	}
}

// TestSteadyStateDeltasAllocateOncePerVersion: with deltas, the only
// allocations of a notification are its version's one patch, made once
// for every connection (BenchmarkPatchFrom in package snapshot counts
// them), not a connection's.
func TestSteadyStateDeltasAllocateOncePerVersion(t *testing.T) {
	const patchAllocs = 8 // BenchmarkPatchFrom's
	if allocs := fanoutAllocs(t, true); allocs > patchAllocs {
		t.Fatalf("%.1f allocations per notification to %d connections asking for deltas, want at most the one patch's %d", allocs, fanoutConns, patchAllocs)
	}
}

const fanoutConns = 50

// fanoutAllocs is the allocations per notification to fanoutConns
// connections watching one task, in the steady state.
func fanoutAllocs(t *testing.T, deltas bool) float64 {
	const conns = fanoutConns
	store := &seqSource{MemoryStore: snapshot.NewMemoryStore()}
	bus := fanout.NewMemoryBus()
	h := hub.New(hub.Config{Source: store, Bus: bus, Writers: 4, Dispatchers: 1})
	bus.Start(h)
	defer bus.Close()
	defer h.Close()
	var count, target atomic.Int64
	sink := countSink{n: &count, target: &target, done: make(chan struct{}, 1)}
	const runs = 100
	snaps := make([]*snapshot.Snapshot, runs+20)
	for i := range snaps {
		snaps[i] = snap(t, "t1", "task_a", int64(i+1))
	}
	store.cur.Store(snaps[0])
	target.Store(conns)
	for range conns {
		c, err := h.Open(hub.Principal{TenantID: "t1", UserID: "u1", Deltas: deltas}, sink)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if _, err := c.Subscribe(context.Background(), hub.Subscription{Tasks: []string{"task_a"}}); err != nil {
			t.Fatal(err)
		}
	}
	<-sink.done // every connection has its initial state
	next := 1
	deliver := func() {
		s := snaps[next]
		next++
		count.Store(0)
		store.cur.Store(s)
		h.Notify(snapshot.Notification{TenantID: "t1", TaskID: "task_a", Version: s.Version})
		<-sink.done
	}
	for range 10 { // warm up: maps, slices and the run queue reach their steady size
		deliver()
	}
	return testing.AllocsPerRun(runs, deliver)
}
