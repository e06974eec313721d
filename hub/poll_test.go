package hub_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pushd/pushd/fanout"
	"github.com/pushd/pushd/hub"
	"github.com/pushd/pushd/snapshot"
)

// nextMode returns the next mode event, skipping tasks.
func (r *recorder) nextMode(t *testing.T) hub.Event {
	t.Helper()
	for {
		ev := r.next(t)
		if ev.Kind == hub.KindMode {
			return ev
		}
	}
}

func TestLostBusPollsUntilRestored(t *testing.T) {
	e := newEnv(t, hub.Config{PollInterval: 20 * time.Millisecond})
	e.publish(t, snap(t, "t1", "task_a", 1))
	e.publish(t, snap(t, "t1", "task_p", 1, "proj"))
	_, r, _ := e.open(t, "t1", "u1", hub.Subscription{Tasks: []string{"task_a"}})
	_, rp, _ := e.open(t, "t1", "u2", hub.Subscription{Projects: []string{"proj"}})
	r.nextTask(t)
	rp.nextTask(t)

	e.hub.Lost(errors.New("connection reset"))
	if ev := r.nextMode(t); ev.Mode != hub.ModePolling || ev.Reason != hub.ReasonPubSubDown {
		t.Fatalf("got mode %q (%s), want polling", ev.Mode, ev.Reason)
	}
	if ev := rp.nextMode(t); ev.Mode != hub.ModePolling {
		t.Fatalf("project watcher got mode %q", ev.Mode)
	}
	// Changes no notification announces still arrive, by polling.
	for _, s := range []int64{2, 3} {
		if _, err := e.store.SetIfNewer(context.Background(), snap(t, "t1", "task_a", s)); err != nil {
			t.Fatal(err)
		}
		if got := r.nextTask(t); got.Version != s {
			t.Fatalf("polled version %d, want %d", got.Version, s)
		}
	}
	e.store.SetIfNewer(context.Background(), snap(t, "t1", "task_p2", 1, "proj"))
	if got := rp.nextTask(t); got.TaskID != "task_p2" {
		t.Fatalf("project watcher polled %s", got.TaskID)
	}

	e.store.SetIfNewer(context.Background(), snap(t, "t1", "task_a", 4))
	e.hub.Restored()
	// The restore re-reads everything once and says push (in one flush the
	// mode event may come first).
	sawV4, sawPush := false, false
	for !sawV4 || !sawPush {
		ev := r.next(t)
		switch {
		case ev.Kind == hub.KindTask && ev.Snapshot.Version == 4:
			sawV4 = true
		case ev.Kind == hub.KindMode && ev.Mode == hub.ModePush && ev.Reason == hub.ReasonRestored:
			sawPush = true
		default:
			t.Fatalf("got %+v, want v4 and mode push", ev)
		}
	}
	if mode, _ := e.hub.Mode(); mode != hub.ModePush {
		t.Fatalf("mode %s", mode)
	}
	// Back in push mode, notifications drive delivery again.
	e.publish(t, snap(t, "t1", "task_a", 5))
	if got := r.nextTask(t); got.Version != 5 {
		t.Fatalf("version %d", got.Version)
	}
}

func TestHelloCarriesCurrentMode(t *testing.T) {
	e := newEnv(t, hub.Config{PollInterval: 20 * time.Millisecond})
	e.hub.Lost(errors.New("down"))
	// Wait until the poll loop switched, seen through an existing connection.
	_, r0, _ := e.open(t, "t1", "u1", hub.Subscription{Tasks: []string{"x"}})
	for {
		ev := <-r0.events
		if ev.Kind == hub.KindMode || (ev.Kind == hub.KindHello && ev.Mode == hub.ModePolling) {
			break
		}
	}
	r := newRecorder()
	c, err := e.hub.Open(hub.Principal{TenantID: "t1", UserID: "u1"}, r)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if ev := <-r.events; ev.Kind != hub.KindHello || ev.Mode != hub.ModePolling {
		t.Fatalf("hello %+v, want mode polling", ev)
	}
}

// failingBus refuses every subscription, as the Redis bus does while Redis
// is down.
type failingBus struct{ ok chan struct{} }

func (b failingBus) Subscribe(ctx context.Context, tenant string) (func(), error) {
	select {
	case <-b.ok:
		return func() {}, nil
	default:
		return nil, errors.New("connection refused")
	}
}

func TestFailedBusSubscriptionIsRetried(t *testing.T) {
	store := &countingSource{MemoryStore: snapshot.NewMemoryStore()}
	bus := failingBus{ok: make(chan struct{})}
	h := hub.New(hub.Config{Source: store, Bus: bus, PollInterval: 20 * time.Millisecond})
	defer h.Close()
	store.SetIfNewer(context.Background(), snap(t, "t1", "task_a", 1))
	r := newRecorder()
	c, err := h.Open(hub.Principal{TenantID: "t1", UserID: "u1"}, r)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Subscribe(context.Background(), hub.Subscription{Tasks: []string{"task_a"}}); err != nil {
		t.Fatalf("a failing bus must not fail the subscription: %v", err)
	}
	if got := r.nextTask(t); got.Version != 1 {
		t.Fatalf("initial version %d", got.Version)
	}
	// Until the bus takes the subscription, the connection is kept fresh
	// by polling; once it does, its tasks are re-read once.
	store.SetIfNewer(context.Background(), snap(t, "t1", "task_a", 2))
	if got := r.nextTask(t); got.Version != 2 {
		t.Fatalf("version %d, want 2", got.Version)
	}
	close(bus.ok)
	store.SetIfNewer(context.Background(), snap(t, "t1", "task_a", 3))
	if got := r.nextTask(t); got.Version != 3 {
		t.Fatalf("version %d, want 3", got.Version)
	}
	if h.Stats().BusRetries == 0 {
		t.Fatal("the subscription was not retried")
	}
}

// downSource fails every read while down is set, as a store does while
// neither Redis nor PostgreSQL answers.
type downSource struct {
	*snapshot.MemoryStore
	down  atomic.Bool
	reads atomic.Int64
}

var errSourcesDown = errors.New("no source answers")

func (s *downSource) Get(ctx context.Context, id string, atLeast int64) (*snapshot.Snapshot, error) {
	s.reads.Add(1)
	if s.down.Load() {
		return nil, errSourcesDown
	}
	return s.MemoryStore.Get(ctx, id, atLeast)
}

func (s *downSource) GetMany(ctx context.Context, ids []string) (map[string]*snapshot.Snapshot, error) {
	s.reads.Add(1)
	if s.down.Load() {
		return nil, errSourcesDown
	}
	return s.MemoryStore.GetMany(ctx, ids)
}

func (s *downSource) Reload(ctx context.Context, ids []string) (map[string]*snapshot.Snapshot, error) {
	s.reads.Add(1)
	if s.down.Load() {
		return nil, errSourcesDown
	}
	return s.MemoryStore.Reload(ctx, ids)
}

// TestFailedInitialReadIsRetried: a task whose current state could not be
// read at subscribe time reaches the client once the sources answer again,
// although it never changes (a finished task does not).
func TestFailedInitialReadIsRetried(t *testing.T) {
	src := &downSource{MemoryStore: snapshot.NewMemoryStore()}
	bus := fanout.NewMemoryBus()
	h := hub.New(hub.Config{Source: src, Bus: bus, PollInterval: 20 * time.Millisecond})
	bus.Start(h)
	t.Cleanup(func() {
		h.Close()
		bus.Close()
	})
	src.SetIfNewer(context.Background(), snap(t, "t1", "done", 7))
	src.down.Store(true)
	r := newRecorder()
	c, err := h.Open(hub.Principal{TenantID: "t1", UserID: "u1"}, r)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	rej, err := c.Subscribe(context.Background(), hub.Subscription{Tasks: []string{"done"}})
	if err != nil || len(rej) != 1 || rej[0].Code != hub.CodeUnavailable {
		t.Fatalf("subscribe while down: %v %v", rej, err)
	}
	// Retried while still down, with backoff, and not given up on.
	deadline := time.Now().Add(10 * time.Second)
	for src.reads.Load() < 3 {
		if time.Now().After(deadline) {
			t.Fatalf("%d reads in 10s: the failed read is not retried", src.reads.Load())
		}
		time.Sleep(5 * time.Millisecond)
	}
	src.down.Store(false)
	if s := r.nextTask(t); s.TaskID != "done" || s.Version != 7 {
		t.Fatalf("got %s v%d", s.TaskID, s.Version)
	}
}

// cutShortSource ends its caller's context during the first Get, as a
// client that goes away mid-subscribe does, and answers every read after.
type cutShortSource struct {
	*snapshot.MemoryStore
	cancel context.CancelFunc
	cut    atomic.Bool
}

func (s *cutShortSource) Get(ctx context.Context, id string, atLeast int64) (*snapshot.Snapshot, error) {
	if s.cut.CompareAndSwap(false, true) {
		s.cancel()
		<-ctx.Done()
		return nil, ctx.Err()
	}
	return s.MemoryStore.Get(ctx, id, atLeast)
}

// TestInitialReadCutShortIsRetried: a subscribe whose initial read its
// context cut short leaves the task watched and unread, and the poll loop
// reads it, so the client gets it although it never changes.
func TestInitialReadCutShortIsRetried(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	src := &cutShortSource{MemoryStore: snapshot.NewMemoryStore(), cancel: cancel}
	bus := fanout.NewMemoryBus()
	h := hub.New(hub.Config{Source: src, Bus: bus, PollInterval: 20 * time.Millisecond})
	bus.Start(h)
	t.Cleanup(func() {
		h.Close()
		bus.Close()
	})
	src.SetIfNewer(context.Background(), snap(t, "t1", "done", 7))
	r := newRecorder()
	c, err := h.Open(hub.Principal{TenantID: "t1", UserID: "u1"}, r)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	if _, err := c.Subscribe(ctx, hub.Subscription{Tasks: []string{"done"}}); !errors.Is(err, context.Canceled) {
		t.Fatalf("subscribe cut short: %v, want context.Canceled", err)
	}
	if s := r.nextTask(t); s.TaskID != "done" || s.Version != 7 {
		t.Fatalf("got %s v%d", s.TaskID, s.Version)
	}
}
