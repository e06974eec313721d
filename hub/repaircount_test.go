package hub_test

import (
	"context"
	"testing"

	"github.com/pushd/pushd/hub"
)

// A repair round that offers a connection a task while its Subscribe is
// still reading the initial state counts no repair: those reads send the
// client the task anyway, and the client reconnecting with an older
// version lost nothing. Once the reads are done, a task the client lacks
// is a repair again. The client gets each version once.
func TestRepairDuringTheInitialReadsCountsNone(t *testing.T) {
	e := newEnv(t, hub.Config{})
	e.publish(t, snap(t, "t1", "task_a", 2))
	entered, release := make(chan struct{}), make(chan struct{})
	e.store.reading = func() {
		close(entered)
		<-release
	}
	r := newRecorder()
	c, err := e.hub.Open(hub.Principal{TenantID: "t1", UserID: "u1", Grant: everyProject}, r)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	subscribed := make(chan error, 1)
	go func() {
		_, err := c.Subscribe(context.Background(), hub.Subscription{Tasks: []string{"task_a"}, Since: map[string]int64{"task_a": 1}})
		subscribed <- err
	}()
	<-entered
	hub.CountRepair(e.hub, snap(t, "t1", "task_a", 2))
	close(release)
	if err := <-subscribed; err != nil {
		t.Fatal(err)
	}
	if st := e.hub.Stats(); st.RepairOlder+st.RepairUnheld != 0 {
		t.Fatalf("a repair during the initial reads counted %d held older, %d unheld; want none", st.RepairOlder, st.RepairUnheld)
	}
	if got := r.nextTask(t); got.Version != 2 {
		t.Fatalf("sent v%d, want v2", got.Version)
	}

	e.store.reading = nil
	s3 := snap(t, "t1", "task_a", 3)
	if _, err := e.store.SetIfNewer(context.Background(), s3); err != nil {
		t.Fatal(err)
	}
	hub.CountRepair(e.hub, s3)
	if st := e.hub.Stats(); st.RepairOlder != 1 {
		t.Fatalf("a repair after the reads counted %d held older, want 1", st.RepairOlder)
	}
	if got := r.nextTask(t); got.Version != 3 {
		t.Fatalf("sent v%d after v2, want v3", got.Version)
	}
}
