package hub_test

import (
	"context"
	"errors"
	"maps"
	"runtime"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pushd/pushd/fanout"
	"github.com/pushd/pushd/hub"
	"github.com/pushd/pushd/internal/testenv"
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
	c, err := e.hub.Open(hub.Principal{TenantID: "t1", UserID: "u1", Grant: everyProject}, r)
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
	c, err := h.Open(hub.Principal{TenantID: "t1", UserID: "u1", Grant: everyProject}, r)
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
// although it never changes (a finished task does not). The connection
// never writes a stream position: its initial state was complete as of
// none, and a client resuming from one would never be sent the task.
func TestFailedInitialReadIsRetried(t *testing.T) {
	src := &downSource{MemoryStore: snapshot.NewMemoryStore()}
	bus := fanout.NewMemoryBus()
	h := hub.New(hub.Config{Source: src, Bus: bus, PollInterval: 20 * time.Millisecond, Stream: &fakeStream{position: "P1"}})
	bus.Start(h)
	t.Cleanup(func() {
		h.Close()
		bus.Close()
	})
	src.SetIfNewer(context.Background(), snap(t, "t1", "done", 7))
	src.down.Store(true)
	r := newRecorder()
	c, err := h.Open(hub.Principal{TenantID: "t1", UserID: "u1", Grant: everyProject}, r)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	rej, err := c.Subscribe(context.Background(), hub.Subscription{Tasks: []string{"done", "other"}, Cursors: true})
	if err != nil || len(rej) != 2 || rej[0].Code != hub.CodeUnavailable {
		t.Fatalf("subscribe while down: %v %v", rej, err)
	}
	// Retried while still down, with backoff, and not given up on.
	testenv.Eventually(t, "the failed read retried", func() bool { return src.reads.Load() >= 3 })
	src.down.Store(false)
	if ev := r.next(t); ev.Kind != hub.KindTask || ev.Snapshot.TaskID != "done" || ev.Snapshot.Version != 7 || ev.Cursor != "" {
		t.Fatalf("got %+v, want done v7 without a stream position", ev)
	}
	src.SetIfNewer(context.Background(), snap(t, "t1", "other", 1))
	bus.Publish(snapshot.Notification{TenantID: "t1", TaskID: "other", Version: 1})
	if ev := r.next(t); ev.Kind != hub.KindTask || ev.Snapshot.TaskID != "other" || ev.Cursor != "" {
		t.Fatalf("got %+v, want other v1 without a stream position", ev)
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
	c, err := h.Open(hub.Principal{TenantID: "t1", UserID: "u1", Grant: everyProject}, r)
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

// nextTaskNoMode returns the next event, failing unless it is a task: the caller
// expects the connection's mode to stay as it is.
func (r *recorder) nextTaskNoMode(t *testing.T, what string) *snapshot.Snapshot {
	t.Helper()
	ev := r.next(t)
	if ev.Kind != hub.KindTask {
		t.Fatalf("%s: got %+v, want a task and no mode event", what, ev)
	}
	return ev.Snapshot
}

// twoTenantsFirstLost is a polling hub with one connection of tenant t1
// watching task_a and one of t2 watching task_b, each past its first
// snapshot, after t1's shard of the bus was reported lost.
func twoTenantsFirstLost(t *testing.T) (e *env, r1, r2 *recorder) {
	t.Helper()
	e = newEnv(t, hub.Config{PollInterval: 20 * time.Millisecond})
	e.publish(t, snap(t, "t1", "task_a", 1))
	e.publish(t, snap(t, "t2", "task_b", 1))
	_, r1, _ = e.open(t, "t1", "u1", hub.Subscription{Tasks: []string{"task_a"}})
	_, r2, _ = e.open(t, "t2", "u1", hub.Subscription{Tasks: []string{"task_b"}})
	r1.nextTask(t)
	r2.nextTask(t)
	e.hub.TenantsLost([]string{"t1"}, errors.New("shard connection reset"))
	return e, r1, r2
}

// A shard of the bus lost for one tenant (TenantsLost): only that tenant's
// connections are told polling and polled, the other tenant's stay in push
// and hear nothing of it; a new connection's hello says its tenant's mode;
// TenantsRestored re-reads the tenant once and tells its connections push.
func TestTenantsLostPollOnlyThoseTenants(t *testing.T) {
	e, r1, r2 := twoTenantsFirstLost(t)
	ctx := context.Background()
	if ev := r1.nextMode(t); ev.Mode != hub.ModePolling || ev.Reason != hub.ReasonPubSubDown {
		t.Fatalf("t1 got mode %q (%s), want polling (pubsub_down)", ev.Mode, ev.Reason)
	}
	// t1's changes that no notification announces arrive by polling.
	for v := int64(2); v <= 3; v++ {
		if _, err := e.store.SetIfNewer(ctx, snap(t, "t1", "task_a", v)); err != nil {
			t.Fatal(err)
		}
		if got := r1.nextTaskNoMode(t, "t1 polling"); got.Version != v {
			t.Fatalf("t1 polled version %d, want %d", got.Version, v)
		}
	}
	// t2 is still pushed, and was told nothing: a mode event queued for it
	// would be written before this task.
	e.publish(t, snap(t, "t2", "task_b", 2))
	if got := r2.nextTaskNoMode(t, "t2 during t1's loss"); got.Version != 2 {
		t.Fatalf("t2 version %d, want 2", got.Version)
	}
	if st := e.hub.Stats(); st.Mode != hub.ModePush || st.PollingTenants != 1 {
		t.Fatalf("stats mode %s, polling tenants %d; want push and 1", st.Mode, st.PollingTenants)
	}
	// New connections are told their own tenant's mode.
	for _, c := range []struct{ tenant, mode, reason string }{
		{"t1", hub.ModePolling, hub.ReasonPubSubDown}, {"t2", hub.ModePush, ""},
	} {
		r := newRecorder()
		conn, err := e.hub.Open(hub.Principal{TenantID: c.tenant, UserID: "u9"}, r)
		if err != nil {
			t.Fatal(err)
		}
		if ev := <-r.events; ev.Kind != hub.KindHello || ev.Mode != c.mode || ev.Reason != c.reason {
			t.Fatalf("hello of %s: %+v, want mode %s (%q)", c.tenant, ev, c.mode, c.reason)
		}
		conn.Close()
	}

	// A change no notification announces, then the shard is back: the
	// restore re-reads it, and t1 is told push.
	if _, err := e.store.SetIfNewer(ctx, snap(t, "t1", "task_a", 4)); err != nil {
		t.Fatal(err)
	}
	e.hub.TenantsRestored([]string{"t1"})
	var last int64 = 3
	for sawPush := false; !sawPush || last < 4; {
		ev := r1.next(t)
		switch {
		case ev.Kind == hub.KindTask && ev.Snapshot.Version > last:
			last = ev.Snapshot.Version
		case ev.Kind == hub.KindMode && ev.Mode == hub.ModePush && ev.Reason == hub.ReasonRestored && !sawPush:
			sawPush = true
		default:
			t.Fatalf("t1 after the restore: got %+v, want v4 and one mode push (restored)", ev)
		}
	}
	if n := e.hub.PollingTenants(); n != 0 {
		t.Fatalf("%d tenants polling after the restore, want 0", n)
	}
	// Back in push mode, notifications drive t1's delivery again.
	e.publish(t, snap(t, "t1", "task_a", 5))
	if got := r1.nextTaskNoMode(t, "t1 after the restore"); got.Version != 5 {
		t.Fatalf("t1 version %d, want 5", got.Version)
	}
	e.publish(t, snap(t, "t2", "task_b", 3))
	if got := r2.nextTaskNoMode(t, "t2 after t1's restore"); got.Version != 3 {
		t.Fatalf("t2 version %d, want 3", got.Version)
	}
}

// A whole-bus loss on top of one tenant's: every connection polls; when the
// bus is restored the other tenant is told push, and the tenant whose shard
// is still lost keeps polling without being told push in between.
func TestTenantLostOutlastsWholeBusLoss(t *testing.T) {
	e, r1, r2 := twoTenantsFirstLost(t)
	ctx := context.Background()
	if ev := r1.nextMode(t); ev.Mode != hub.ModePolling {
		t.Fatalf("t1 got mode %q, want polling", ev.Mode)
	}
	e.hub.Lost(errors.New("connection reset"))
	if ev := r2.nextMode(t); ev.Mode != hub.ModePolling || ev.Reason != hub.ReasonPubSubDown {
		t.Fatalf("t2 got mode %q (%s), want polling", ev.Mode, ev.Reason)
	}
	e.hub.Restored()
	if ev := r2.nextMode(t); ev.Mode != hub.ModePush || ev.Reason != hub.ReasonRestored {
		t.Fatalf("t2 got mode %q (%s), want push (restored)", ev.Mode, ev.Reason)
	}
	if mode, _ := e.hub.Mode(); mode != hub.ModePush {
		t.Fatalf("node mode %s after Restored, want push", mode)
	}
	// t1 is still polled, and heard no mode since its polling: the node's
	// loss and restore did not change what it had to be told.
	if _, err := e.store.SetIfNewer(ctx, snap(t, "t1", "task_a", 2)); err != nil {
		t.Fatal(err)
	}
	for {
		got := r1.nextTaskNoMode(t, "t1 across the node's loss")
		if got.Version == 2 {
			break
		}
	}
	e.hub.TenantsRestored([]string{"t1"})
	if ev := r1.nextMode(t); ev.Mode != hub.ModePush || ev.Reason != hub.ReasonRestored {
		t.Fatalf("t1 got mode %q (%s), want push (restored)", ev.Mode, ev.Reason)
	}
}

// deadlineSource makes its caller's first Get of slow wait out the
// caller's deadline, as a source too slow for a subscription's timeout
// does, and answers every read after.
type deadlineSource struct {
	*snapshot.MemoryStore
	slow string
	cut  atomic.Bool
}

func (s *deadlineSource) Get(ctx context.Context, id string, atLeast int64) (*snapshot.Snapshot, error) {
	if id == s.slow && s.cut.CompareAndSwap(false, true) {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	return s.MemoryStore.Get(ctx, id, atLeast)
}

// TestInitialReadsPastTheDeadlineAreUnavailable: a subscribe whose initial
// reads outlast its deadline (the transport's subscribe timeout) stands,
// with what was read offered and what was not rejected unavailable, and
// the poll loop reads those, so the client gets every task.
func TestInitialReadsPastTheDeadlineAreUnavailable(t *testing.T) {
	src := &deadlineSource{MemoryStore: snapshot.NewMemoryStore(), slow: "slow"}
	bus := fanout.NewMemoryBus()
	h := hub.New(hub.Config{Source: src, Bus: bus, PollInterval: 20 * time.Millisecond})
	bus.Start(h)
	t.Cleanup(func() {
		h.Close()
		bus.Close()
	})
	for _, id := range []string{"fast", "slow", "later"} {
		src.SetIfNewer(context.Background(), snap(t, "t1", id, 3))
	}
	r := newRecorder()
	c, err := h.Open(hub.Principal{TenantID: "t1", UserID: "u1", Grant: everyProject}, r)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	ctx, cancel := context.WithTimeout(context.Background(), time.Second) // the slow read waits it out; the fast one is done long before
	defer cancel()
	rejected, err := c.Subscribe(ctx, hub.Subscription{Tasks: []string{"fast", "slow", "later"}, Projects: []string{"p1"}})
	if err != nil {
		t.Fatalf("subscribe past its deadline: %v, want it to stand", err)
	}
	want := []hub.Rejection{{TaskID: "slow", Code: hub.CodeUnavailable}, {TaskID: "later", Code: hub.CodeUnavailable}, {ProjectID: "p1", Code: hub.CodeUnavailable}}
	if !slices.Equal(rejected, want) {
		t.Fatalf("rejected %+v, want %+v", rejected, want)
	}
	got := map[string]int64{}
	for len(got) < 3 {
		s := r.nextTask(t)
		got[s.TaskID] = s.Version
	}
	if !maps.Equal(got, map[string]int64{"fast": 3, "slow": 3, "later": 3}) {
		t.Fatalf("got %v, want every task at version 3", got)
	}
}

// A re-read of the watched tasks that waits for a connection's lock (held
// by its Subscribe, which may wait on a read budget) does not hold the
// hub's lock meanwhile: the node's connects go on.
func TestRefreshWaitingForAConnStopsNoConnect(t *testing.T) {
	e := newEnv(t, hub.Config{})
	e.publish(t, snap(t, "t1", "task_a", 1))
	c, r, _ := e.open(t, "t1", "u1", hub.Subscription{Tasks: []string{"task_a"}})
	r.nextTask(t)
	release := hub.HoldConn(c)
	done := make(chan bool, 1)
	go func() { done <- hub.Refresh(e.hub) }()
	testenv.Eventually(t, "the re-read waiting for the connection's lock", func() bool {
		buf := make([]byte, 1<<20)
		stacks := string(buf[:runtime.Stack(buf, true)])
		for g := range strings.SplitSeq(stacks, "\n\n") {
			if strings.Contains(g, "hub.(*Hub).refresh") && strings.Contains(g, "sync.(*Mutex).Lock") {
				return true
			}
		}
		return false
	})
	reserved := make(chan struct{})
	go func() {
		slot, _ := e.hub.Reserve("192.0.2.1", 0, 0)
		slot.Release()
		close(reserved)
	}()
	select {
	case <-reserved:
	case <-time.After(10 * time.Second): // a bound on the failure
		release()
		t.Fatal("a connect's slot waited for the re-read, which waits for a connection")
	}
	release()
	if !<-done {
		t.Error("the re-read failed")
	}
}
