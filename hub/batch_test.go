package hub_test

import (
	"context"
	"slices"
	"sync"
	"testing"

	"github.com/pushd/pushd/fanout"
	"github.com/pushd/pushd/hub"
	"github.com/pushd/pushd/snapshot"
)

// batchSource is an in-memory store whose notification reads of one task
// (the gate) wait until the test lets them go, so that the notifications
// heard meanwhile pile up in the hub's queue; it records every GetMany.
// stale, when set, is what GetMany answers for that task instead of the
// stored version: Redis having lost a write.
type batchSource struct {
	*snapshot.MemoryStore
	gate    string
	entered chan struct{}
	release chan struct{}
	stale   *snapshot.Snapshot

	mu    sync.Mutex
	gets  []string   // ids Get read for notifications, the gate's excepted
	many  [][]string // the ids of each GetMany
	erred bool       // GetMany fails once
}

func (s *batchSource) Get(ctx context.Context, id string, atLeast int64) (*snapshot.Snapshot, error) {
	if atLeast > 0 {
		if id == s.gate {
			s.entered <- struct{}{}
			<-s.release
		} else {
			s.mu.Lock()
			s.gets = append(s.gets, id)
			s.mu.Unlock()
		}
	}
	return s.MemoryStore.Get(ctx, id, atLeast)
}

func (s *batchSource) GetMany(ctx context.Context, ids []string) (map[string]*snapshot.Snapshot, error) {
	s.mu.Lock()
	s.many = append(s.many, slices.Clone(ids))
	fail := s.erred
	s.erred = false
	s.mu.Unlock()
	if fail {
		return nil, snapshot.ErrInvalidID
	}
	out, err := s.MemoryStore.GetMany(ctx, ids)
	if s.stale != nil && out[s.stale.TaskID] != nil {
		out[s.stale.TaskID] = s.stale
	}
	return out, err
}

// piledUp opens a connection watching the gate and tasks, publishes a new
// version of the gate so that the only dispatcher waits on it, then a new
// version of every task, and lets the dispatcher go. It returns the
// connection's recorder once the gate's version arrived.
func piledUp(t *testing.T, src *batchSource, tasks []string) *recorder {
	t.Helper()
	bus := fanout.NewMemoryBus()
	h := hub.New(hub.Config{Source: src, Bus: bus, Dispatchers: 1})
	bus.Start(h)
	t.Cleanup(func() {
		h.Close()
		_ = bus.Close()
	})
	pub := &fanout.MemoryPublisher{Store: src.MemoryStore, Bus: bus}
	publish := func(task string, v int64) {
		if _, err := pub.Publish(context.Background(), snap(t, "t1", task, v)); err != nil {
			t.Fatal(err)
		}
	}
	all := append([]string{src.gate}, tasks...)
	for _, id := range all {
		publish(id, 1)
	}
	r := newRecorder()
	c, err := h.Open(hub.Principal{TenantID: "t1", UserID: "u1", Grant: everyProject}, r)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	if _, err := c.Subscribe(context.Background(), hub.Subscription{Tasks: all}); err != nil {
		t.Fatal(err)
	}
	for range all {
		r.nextTask(t)
	}
	publish(src.gate, 2)
	<-src.entered
	for _, id := range tasks {
		publish(id, 2)
	}
	close(src.release)
	return r
}

func newBatchSource() *batchSource {
	return &batchSource{MemoryStore: snapshot.NewMemoryStore(), gate: "gate",
		entered: make(chan struct{}, 1), release: make(chan struct{})}
}

// Notifications heard while the dispatchers are busy are read together,
// with one GetMany, and each task is still delivered.
func TestNotificationsQueuedTogetherAreReadTogether(t *testing.T) {
	src := newBatchSource()
	tasks := []string{"a0", "a1", "a2", "a3", "a4", "a5", "a6", "a7", "a8", "a9"}
	r := piledUp(t, src, tasks)
	got := map[string]int64{}
	for range len(tasks) + 1 {
		s := r.nextTask(t)
		got[s.TaskID] = s.Version
	}
	for _, id := range append(tasks, "gate") {
		if got[id] != 2 {
			t.Errorf("task %s: delivered version %d, want 2", id, got[id])
		}
	}
	src.mu.Lock()
	defer src.mu.Unlock()
	if len(src.many) != 1 || !slices.Equal(src.many[0], tasks) {
		t.Fatalf("GetMany calls %v, want one of %v", src.many, tasks)
	}
	if len(src.gets) != 0 {
		t.Fatalf("tasks read alone as well: %v", src.gets)
	}
}

// A task that the batch read older than announced is read again alone
// (Get knows to ask PostgreSQL), and a batch read that fails costs no task
// its delivery: each is read alone.
func TestBatchReadFallsBackToOneByOne(t *testing.T) {
	t.Run("older", func(t *testing.T) {
		src := newBatchSource()
		src.stale = snap(t, "t1", "a1", 1)
		r := piledUp(t, src, []string{"a0", "a1", "a2"})
		got := map[string]int64{}
		for range 4 {
			s := r.nextTask(t)
			got[s.TaskID] = s.Version
		}
		if got["a1"] != 2 {
			t.Fatalf("a1 delivered at version %d, want 2 (all: %v)", got["a1"], got)
		}
		src.mu.Lock()
		defer src.mu.Unlock()
		if !slices.Equal(src.gets, []string{"a1"}) {
			t.Fatalf("read alone: %v, want only a1", src.gets)
		}
	})
	t.Run("failed", func(t *testing.T) {
		src := newBatchSource()
		src.erred = true
		r := piledUp(t, src, []string{"a0", "a1", "a2"})
		got := map[string]int64{}
		for range 4 {
			s := r.nextTask(t)
			got[s.TaskID] = s.Version
		}
		for _, id := range []string{"a0", "a1", "a2"} {
			if got[id] != 2 {
				t.Errorf("task %s: delivered version %d, want 2", id, got[id])
			}
		}
		src.mu.Lock()
		defer src.mu.Unlock()
		if len(src.many) != 1 || len(src.gets) != 3 {
			t.Fatalf("GetMany %v, read alone %v: want one batch, then each of the three alone", src.many, src.gets)
		}
	})
}
