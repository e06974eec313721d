package fanout

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/pushd/pushd/snapshot"
)

func TestMemoryBus(t *testing.T) {
	b := NewMemoryBus()
	n := snapshot.Notification{TenantID: "t1", TaskID: "task_1", Version: 1}
	if _, err := b.Subscribe(context.Background(), "t1"); err == nil {
		t.Fatal("Subscribe before Start succeeded")
	}
	r := newRecorder(t)
	b.Start(r)

	b.Publish(n) // delivery is synchronous: what is not in the channel now never comes
	none(t, r.notes, "notification without a subscriber")

	releaseA := mustSubscribe(t, b, "t1")
	releaseB := mustSubscribe(t, b, "t1")
	b.Publish(n)
	if got := next(t, r.notes, "notification"); got != n {
		t.Fatalf("got %+v, want %+v", got, n)
	}
	b.Publish(snapshot.Notification{TenantID: "t2", TaskID: "task_2", Version: 1})
	none(t, r.notes, "notification of another tenant")

	releaseA()
	releaseA() // idempotent: B's reference stays
	b.Publish(n)
	next(t, r.notes, "notification with one reference left")
	releaseB()
	b.Publish(n)
	none(t, r.notes, "notification after the last release")

	if _, err := b.Subscribe(context.Background(), "bad id"); !errors.Is(err, snapshot.ErrInvalidID) {
		t.Fatalf("Subscribe(bad id) = %v", err)
	}
	mustSubscribe(t, b, "t1")
	for range 2 {
		if err := b.Close(); err != nil {
			t.Fatal(err)
		}
	}
	b.Publish(n)
	none(t, r.notes, "notification after Close")
	if _, err := b.Subscribe(context.Background(), "t1"); !errors.Is(err, ErrClosed) {
		t.Fatalf("Subscribe after Close = %v, want ErrClosed", err)
	}
	none(t, r.resyncs, "resync")
}

func testSnapshot(t *testing.T, tenant, task string, version int64) *snapshot.Snapshot {
	t.Helper()
	s, err := snapshot.Parse(fmt.Appendf(nil,
		`{"task_id":%q,"tenant_id":%q,"project_id":"p1","user_id":"u1","status":"RUNNING","progress":45,"version":%d,"updated_at":1710000000000}`,
		task, tenant, version))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestMemoryPublisher(t *testing.T) {
	bus := NewMemoryBus()
	r := newRecorder(t)
	bus.Start(r)
	defer bus.Close()
	mustSubscribe(t, bus, "t1")
	store := snapshot.NewMemoryStore()
	p := MemoryPublisher{Store: store, Bus: bus}
	ctx := testContext(t)

	for _, step := range []struct {
		version int64
		written bool
	}{{2, true}, {1, false}, {2, false}, {3, true}} {
		written, err := p.Publish(ctx, testSnapshot(t, "t1", "task_1", step.version))
		if err != nil || written != step.written {
			t.Fatalf("publish version %d = %v, %v, want %v", step.version, written, err, step.written)
		}
		if !step.written {
			none(t, r.notes, "notification of a stale snapshot")
			continue
		}
		want := snapshot.Notification{TenantID: "t1", TaskID: "task_1", Version: step.version, ProjectID: "p1",
			UserID: "u1", Status: "RUNNING", OccurredAt: 1710000000000}
		if got := next(t, r.notes, "notification"); got != want {
			t.Fatalf("got %+v, want %+v", got, want)
		}
		if got, err := store.Get(ctx, "task_1", 0); err != nil || got.Version != step.version {
			t.Fatalf("stored %+v, %v; want version %d", got, err, step.version)
		}
	}
	if _, err := p.Publish(ctx, nil); err == nil {
		t.Fatal("Publish(nil) succeeded")
	}
}
