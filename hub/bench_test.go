package hub_test

import (
	"context"
	"fmt"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pushd/pushd/fanout"
	"github.com/pushd/pushd/hub"
	"github.com/pushd/pushd/snapshot"
)

// discard is a Sink that drops what it is given.
type discard struct{ n chan struct{} }

func (d discard) Write(evs []hub.Event) (bool, error) {
	for _, ev := range evs {
		if ev.Kind == hub.KindTask {
			d.n <- struct{}{}
		}
	}
	return false, nil
}
func (discard) Closed(hub.CloseReason) {}
func (discard) Bind(*hub.Conn)         {}

// BenchmarkDelivery is one snapshot through the hub to one connection: the
// notification, the read, the outbox and the writer.
func BenchmarkDelivery(b *testing.B) {
	store := snapshot.NewMemoryStore()
	bus := fanout.NewMemoryBus()
	h := hub.New(hub.Config{Source: store, Bus: bus})
	bus.Start(h)
	defer bus.Close()
	defer h.Close()
	d := discard{n: make(chan struct{}, 1)}
	c, _ := h.Open(hub.Principal{TenantID: "t1", UserID: "u1"}, d)
	defer c.Close()
	c.Subscribe(context.Background(), hub.Subscription{Tasks: []string{"task_a"}})
	snaps := make([]*snapshot.Snapshot, b.N+1)
	for i := range snaps {
		snaps[i] = snap(b, "t1", "task_a", int64(i+1))
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		store.SetIfNewer(context.Background(), snaps[i+1])
		h.Notify(snapshot.Notification{TenantID: "t1", TaskID: "task_a", Version: int64(i + 2)})
		<-d.n
	}
}

// countSink counts task events and signals when a target is reached.
type countSink struct {
	n, target *atomic.Int64
	done      chan struct{}
}

func (s countSink) Write(evs []hub.Event) (bool, error) {
	for _, ev := range evs {
		if ev.Kind == hub.KindTask && s.n.Add(1) == s.target.Load() {
			s.done <- struct{}{}
		}
	}
	return false, nil
}
func (countSink) Closed(hub.CloseReason) {}
func (countSink) Bind(*hub.Conn)         {}

// BenchmarkFanout is one notification delivered to every one of n
// connections watching the task: ns/op is per notification.
func BenchmarkFanout(b *testing.B) {
	for _, n := range []int{10, 100, 1000, 10000} {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			store := &seqSource{MemoryStore: snapshot.NewMemoryStore()}
			bus := fanout.NewMemoryBus()
			h := hub.New(hub.Config{Source: store, Bus: bus})
			bus.Start(h)
			defer bus.Close()
			defer h.Close()
			var count, target atomic.Int64
			sink := countSink{n: &count, target: &target, done: make(chan struct{}, 1)}
			snaps := make([]*snapshot.Snapshot, b.N+1)
			for i := range snaps {
				snaps[i] = snap(b, "t1", "task_a", int64(i+1))
			}
			store.cur.Store(snaps[0])
			for range n {
				c, _ := h.Open(hub.Principal{TenantID: "t1", UserID: "u1"}, sink)
				defer c.Close()
				c.Subscribe(context.Background(), hub.Subscription{Tasks: []string{"task_a"}})
			}
			for count.Load() < int64(n) {
				runtime.Gosched()
			}
			b.ReportAllocs()
			b.ResetTimer()
			for i := 1; i <= b.N; i++ {
				count.Store(0)
				target.Store(int64(n))
				store.cur.Store(snaps[i])
				h.Notify(snapshot.Notification{TenantID: "t1", TaskID: "task_a", Version: int64(i + 1)})
				<-sink.done
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/delivery")
		})
	}
}

// sessionHold is a Hold whose revocation is read through a pointer to its
// session's entry, as admission's is: one object per connection, one
// shared per session.
type sessionHold struct{ session atomic.Pointer[atomic.Bool] }

func (h *sessionHold) Attach()       {}
func (h *sessionHold) Revoked() bool { s := h.session.Load(); return s != nil && s.Load() }
func (h *sessionHold) Rebind(string) {}
func (h *sessionHold) Release()      {}

// BenchmarkTick is the ticker's once-a-second pass over a node's idle
// connections, each with a token expiry and a Hold: ns/op per pass,
// ns/conn per connection.
func BenchmarkTick(b *testing.B) {
	const n = 10000
	h := hub.New(hub.Config{Source: snapshot.NewMemoryStore(), Bus: fanout.NewMemoryBus()})
	defer h.Close()
	var live atomic.Bool
	expires := time.Now().Add(time.Hour)
	for i := range n {
		hold := &sessionHold{}
		if i%2 == 0 {
			hold.session.Store(&live) // a session token; the others are JWTs
		}
		c, err := h.Open(hub.Principal{TenantID: "t1", UserID: fmt.Sprint("u", i), ExpiresAt: expires, Hold: hold}, discard{n: make(chan struct{}, 1)})
		if err != nil {
			b.Fatal(err)
		}
		defer c.Close()
	}
	// Ticks at the same instant: nothing is due, every connection is looked at.
	now := time.Now()
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		hub.Tick(h, now)
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/conn")
}
