package hub_test

import (
	"context"
	"testing"

	"github.com/pushd/pushd/fanout"
	"github.com/pushd/pushd/hub"
	"github.com/pushd/pushd/snapshot"
)

// discard is a Sink that drops what it is given.
type discard struct{ n chan struct{} }

func (d discard) Write(evs []hub.Event) error {
	for _, ev := range evs {
		if ev.Kind == hub.KindTask {
			d.n <- struct{}{}
		}
	}
	return nil
}
func (discard) Closed(hub.CloseReason) {}

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
		h.Notify(fanout.Notification{TenantID: "t1", TaskID: "task_a", Version: int64(i + 2)})
		<-d.n
	}
}
