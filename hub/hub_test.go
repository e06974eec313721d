package hub_test

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/pushd/pushd/fanout"
	"github.com/pushd/pushd/hub"
	"github.com/pushd/pushd/internal/testenv"
	"github.com/pushd/pushd/snapshot"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// recorder is a Sink that hands every written batch to the test. gate, when
// set, blocks each Write until the test sends on it: a slow client.
type recorder struct {
	events  chan hub.Event
	closed  chan hub.CloseReason
	gate    chan struct{}
	entered chan struct{} // with gate: told each time a Write starts waiting
	writes  atomic.Int64
	once    sync.Once
}

func newRecorder() *recorder {
	return &recorder{events: make(chan hub.Event, 4096), closed: make(chan hub.CloseReason, 1)}
}

func (r *recorder) Write(evs []hub.Event) (bool, error) {
	if r.gate != nil {
		if r.entered != nil {
			r.entered <- struct{}{}
		}
		<-r.gate
	}
	r.writes.Add(1)
	for _, ev := range evs {
		r.events <- ev
	}
	return false, nil
}

func (*recorder) Bind(*hub.Conn) {}

func (r *recorder) Closed(reason hub.CloseReason) {
	r.once.Do(func() { r.closed <- reason })
}

// next returns the next event that is not a hello or heartbeat.
func (r *recorder) next(t *testing.T) hub.Event {
	t.Helper()
	timeout := time.After(10 * time.Second)
	for {
		select {
		case ev := <-r.events:
			if ev.Kind == hub.KindHello || ev.Kind == hub.KindHeartbeat {
				continue
			}
			return ev
		case <-timeout:
			t.Fatal("no event within 10s")
			return hub.Event{}
		}
	}
}

func (r *recorder) nextTask(t *testing.T) *snapshot.Snapshot {
	t.Helper()
	ev := r.next(t)
	if ev.Kind != hub.KindTask {
		t.Fatalf("got event kind %d (%+v), want a task", ev.Kind, ev)
	}
	return ev.Snapshot
}

// countingSource counts reads of a real in-memory store.
type countingSource struct {
	*snapshot.MemoryStore
	gets    atomic.Int64
	reading func() // if set, called by each Get before it reads
}

func (s *countingSource) Get(ctx context.Context, id string, atLeast int64) (*snapshot.Snapshot, error) {
	s.gets.Add(1)
	if s.reading != nil {
		s.reading()
	}
	return s.MemoryStore.Get(ctx, id, atLeast)
}

type env struct {
	hub   *hub.Hub
	store *countingSource
	bus   *fanout.MemoryBus
	pub   *fanout.MemoryPublisher
}

func newEnv(t *testing.T, cfg hub.Config) *env {
	t.Helper()
	e := &env{store: &countingSource{MemoryStore: snapshot.NewMemoryStore()}, bus: fanout.NewMemoryBus()}
	cfg.Source, cfg.Bus = e.store, e.bus
	e.hub = hub.New(cfg)
	e.bus.Start(e.hub)
	e.pub = &fanout.MemoryPublisher{Store: e.store.MemoryStore, Bus: e.bus}
	t.Cleanup(func() {
		e.hub.Close()
		e.bus.Close()
	})
	return e
}

func snap(t testing.TB, tenant, task string, version int64, extra ...string) *snapshot.Snapshot {
	t.Helper()
	project, user := "p1", "u1"
	if len(extra) > 0 {
		project = extra[0]
	}
	if len(extra) > 1 {
		user = extra[1]
	}
	s, err := snapshot.Parse(fmt.Appendf(nil,
		`{"task_id":%q,"tenant_id":%q,"project_id":%q,"user_id":%q,"status":"RUNNING","progress":%d,"version":%d,"updated_at":1710000000000}`,
		task, tenant, project, user, version%101, version))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func (e *env) publish(t testing.TB, s *snapshot.Snapshot) {
	t.Helper()
	if _, err := e.pub.Publish(context.Background(), s); err != nil {
		t.Fatal(err)
	}
}

func (e *env) open(t *testing.T, tenant, user string, sub hub.Subscription) (*hub.Conn, *recorder, []hub.Rejection) {
	t.Helper()
	r := newRecorder()
	c, err := e.hub.Open(hub.Principal{TenantID: tenant, UserID: user, Grant: everyProject}, r)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	rej, err := c.Subscribe(context.Background(), sub)
	if err != nil {
		t.Fatal(err)
	}
	return c, r, rej
}

func TestInitialSnapshotThenNewerVersions(t *testing.T) {
	e := newEnv(t, hub.Config{})
	e.publish(t, snap(t, "t1", "task_a", 3))
	_, r, rej := e.open(t, "t1", "u1", hub.Subscription{Tasks: []string{"task_a"}})
	if len(rej) != 0 {
		t.Fatalf("rejected: %+v", rej)
	}
	if got := r.nextTask(t); got.Version != 3 {
		t.Fatalf("initial version %d, want 3", got.Version)
	}
	for v := int64(4); v <= 8; v++ {
		e.publish(t, snap(t, "t1", "task_a", v))
		if got := r.nextTask(t); got.Version != v {
			t.Fatalf("got version %d, want %d", got.Version, v)
		}
	}
}

func TestOlderVersionNeverDelivered(t *testing.T) {
	e := newEnv(t, hub.Config{})
	e.publish(t, snap(t, "t1", "task_a", 5))
	c, r, _ := e.open(t, "t1", "u1", hub.Subscription{Tasks: []string{"task_a"}})
	if got := r.nextTask(t); got.Version != 5 {
		t.Fatalf("initial version %d", got.Version)
	}
	// The store refuses stale writes, so feed the hub directly: a
	// notification announcing an old version must not bring one back, and
	// neither may the bus replaying one.
	e.hub.Notify(snapshot.Notification{TenantID: "t1", TaskID: "task_a", Version: 2})
	e.hub.Resync("t1")
	e.publish(t, snap(t, "t1", "task_a", 6))
	if got := r.nextTask(t); got.Version != 6 {
		t.Fatalf("got version %d, want 6", got.Version)
	}
	_ = c
}

func TestSinceSkipsVersionsTheClientHas(t *testing.T) {
	e := newEnv(t, hub.Config{})
	e.publish(t, snap(t, "t1", "task_a", 7))
	e.publish(t, snap(t, "t1", "task_b", 2))
	_, r, _ := e.open(t, "t1", "u1", hub.Subscription{
		Tasks: []string{"task_a", "task_b"}, Since: map[string]int64{"task_a": 7, "task_b": 1},
	})
	got := r.nextTask(t)
	if got.TaskID != "task_b" || got.Version != 2 {
		t.Fatalf("got %s v%d, want task_b v2 (task_a v7 is what the client has)", got.TaskID, got.Version)
	}
	e.publish(t, snap(t, "t1", "task_a", 8))
	if got := r.nextTask(t); got.TaskID != "task_a" || got.Version != 8 {
		t.Fatalf("got %s v%d, want task_a v8", got.TaskID, got.Version)
	}
}

func TestSlowClientOutboxConflates(t *testing.T) {
	e := newEnv(t, hub.Config{})
	e.publish(t, snap(t, "t1", "task_a", 1))
	r := newRecorder()
	gate := make(chan struct{})
	r.gate, r.entered = gate, make(chan struct{}, 8)
	c, err := e.hub.Open(hub.Principal{TenantID: "t1", UserID: "u1"}, r)
	if err != nil {
		t.Fatal(err)
	}
	released := false
	defer func() {
		if !released {
			close(gate)
		}
		c.Close()
	}()
	<-r.entered // the writer is stuck writing the hello: a client that stopped reading
	if _, err := c.Subscribe(context.Background(), hub.Subscription{Tasks: []string{"task_a"}}); err != nil {
		t.Fatal(err)
	}
	for v := int64(2); v <= 50; v++ {
		e.publish(t, snap(t, "t1", "task_a", v))
	}
	// Every version queued behind the stuck write; only the newest survives.
	testenv.Eventually(t, "version 50 pending", func() bool { return hub.PendingVersion(c, "task_a") == 50 })
	released = true
	close(gate)
	if got := r.nextTask(t); got.Version != 50 {
		t.Fatalf("first task version %d, want 50: the outbox should hold only the newest", got.Version)
	}
	if w := r.writes.Load(); w != 2 {
		t.Fatalf("%d writes, want 2 (the hello, then v50)", w)
	}
}

func TestOneReadPerNotificationForManyWatchers(t *testing.T) {
	e := newEnv(t, hub.Config{})
	e.publish(t, snap(t, "t1", "task_a", 1))
	const n = 200
	recs := make([]*recorder, n)
	for i := range recs {
		_, recs[i], _ = e.open(t, "t1", "u1", hub.Subscription{Tasks: []string{"task_a"}})
		recs[i].nextTask(t)
	}
	before := e.store.gets.Load()
	e.publish(t, snap(t, "t1", "task_a", 2))
	for _, r := range recs {
		if got := r.nextTask(t); got.Version != 2 {
			t.Fatalf("version %d, want 2", got.Version)
		}
	}
	if reads := e.store.gets.Load() - before; reads != 1 {
		t.Fatalf("%d snapshot reads for one notification to %d watchers, want 1", reads, n)
	}
}

func TestTenantIsolation(t *testing.T) {
	e := newEnv(t, hub.Config{})
	e.publish(t, snap(t, "tB", "task_b", 1))
	_, r, rej := e.open(t, "tA", "u1", hub.Subscription{Tasks: []string{"task_b", "task_missing"}})
	if len(rej) != 2 || rej[0].Code != hub.CodeNotFound || rej[1].Code != hub.CodeNotFound {
		t.Fatalf("rejections %+v, want not_found for both (another tenant's task looks absent)", rej)
	}
	// B's task changes; a notification for it also arrives on A's channel.
	dropped := e.hub.Stats().Dropped[hub.DropTenant]
	e.publish(t, snap(t, "tB", "task_b", 2))
	e.hub.Notify(snapshot.Notification{TenantID: "tA", TaskID: "task_b", Version: 3})
	e.publish(t, snap(t, "tB", "task_b", 3))
	// The dispatchers read notifications side by side: once the one on A's
	// channel is counted dropped, a marker published after must be A's
	// next event.
	testenv.Eventually(t, "the notification on A's channel for B's task counted as dropped", func() bool {
		return e.hub.Stats().Dropped[hub.DropTenant] > dropped
	})
	e.publish(t, snap(t, "tA", "task_missing", 1))
	got := r.nextTask(t)
	if got.TaskID != "task_missing" || got.TenantID != "tA" {
		t.Fatalf("tenant A received %s of tenant %s", got.TaskID, got.TenantID)
	}
}

func TestProjectAndUserScopes(t *testing.T) {
	e := newEnv(t, hub.Config{})
	e.publish(t, snap(t, "t1", "task_old", 1, "proj", "alice"))
	_, rp, _ := e.open(t, "t1", "bob", hub.Subscription{Projects: []string{"proj"}})
	_, ru, _ := e.open(t, "t1", "alice", hub.Subscription{User: true})
	if got := rp.nextTask(t); got.TaskID != "task_old" {
		t.Fatalf("project watcher got %s", got.TaskID)
	}
	if got := ru.nextTask(t); got.TaskID != "task_old" {
		t.Fatalf("user watcher got %s", got.TaskID)
	}
	// A task created later reaches both; one of another project and user
	// reaches neither.
	e.publish(t, snap(t, "t1", "task_other", 1, "proj2", "carol"))
	e.publish(t, snap(t, "t1", "task_new", 1, "proj", "alice"))
	if got := rp.nextTask(t); got.TaskID != "task_new" {
		t.Fatalf("project watcher got %s, want task_new", got.TaskID)
	}
	if got := ru.nextTask(t); got.TaskID != "task_new" {
		t.Fatalf("user watcher got %s, want task_new", got.TaskID)
	}
}

func TestNotFoundTaskStaysWatched(t *testing.T) {
	e := newEnv(t, hub.Config{})
	_, r, rej := e.open(t, "t1", "u1", hub.Subscription{Tasks: []string{"task_later"}})
	if len(rej) != 1 || rej[0].Code != hub.CodeNotFound {
		t.Fatalf("rejections %+v", rej)
	}
	e.publish(t, snap(t, "t1", "task_later", 1))
	if got := r.nextTask(t); got.TaskID != "task_later" {
		t.Fatalf("got %s", got.TaskID)
	}
}

func TestUnsubscribeStopsDelivery(t *testing.T) {
	e := newEnv(t, hub.Config{})
	e.publish(t, snap(t, "t1", "task_a", 1))
	e.publish(t, snap(t, "t1", "task_b", 1))
	c, r, _ := e.open(t, "t1", "u1", hub.Subscription{Tasks: []string{"task_a", "task_b"}})
	r.nextTask(t)
	r.nextTask(t)
	c.Unsubscribe([]string{"task_a"}, nil)
	e.publish(t, snap(t, "t1", "task_a", 2))
	e.publish(t, snap(t, "t1", "task_b", 2))
	if got := r.nextTask(t); got.TaskID != "task_b" {
		t.Fatalf("got %s after unsubscribing it", got.TaskID)
	}
}

func TestSubscriptionLimitAndInvalidIDs(t *testing.T) {
	e := newEnv(t, hub.Config{MaxSubscriptions: 2})
	_, _, rej := e.open(t, "t1", "u1", hub.Subscription{Tasks: []string{"a1", "bad id", "a2", "a3"}})
	codes := map[string]string{}
	for _, r := range rej {
		codes[r.TaskID] = r.Code
	}
	if codes["bad id"] != hub.CodeInvalidID || codes["a3"] != hub.CodeTooMany {
		t.Fatalf("rejections %+v", rej)
	}
}

func TestIdleConnectionsHoldNoGoroutine(t *testing.T) {
	e := newEnv(t, hub.Config{})
	e.publish(t, snap(t, "t1", "task_a", 1))
	before := runtime.NumGoroutine()
	const n = 500
	for range n {
		_, r, _ := e.open(t, "t1", "u1", hub.Subscription{Tasks: []string{"task_a"}})
		r.nextTask(t)
	}
	if after := runtime.NumGoroutine(); after-before > 10 {
		t.Fatalf("%d goroutines for %d idle connections; the hub should need none per connection", after-before, n)
	}
}

func TestHeartbeatOnIdleConnection(t *testing.T) {
	e := newEnv(t, hub.Config{HeartbeatInterval: 20 * time.Millisecond})
	_, r, _ := e.open(t, "t1", "u1", hub.Subscription{Tasks: []string{"task_a"}})
	timeout := time.After(10 * time.Second)
	for {
		select {
		case ev := <-r.events:
			if ev.Kind == hub.KindHeartbeat {
				return
			}
		case <-timeout:
			t.Fatal("no heartbeat")
		}
	}
}

func TestExpiredTokenEndsConnection(t *testing.T) {
	e := newEnv(t, hub.Config{HeartbeatInterval: 20 * time.Millisecond})
	r := newRecorder()
	c, err := e.hub.Open(hub.Principal{TenantID: "t1", UserID: "u1", ExpiresAt: time.Now().Add(50 * time.Millisecond)}, r)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ev := r.next(t)
	if ev.Kind != hub.KindError || ev.Code != hub.CodeTokenExpired {
		t.Fatalf("got %+v, want a token_expired error", ev)
	}
	select {
	case reason := <-r.closed:
		if reason != hub.CloseTokenExpired {
			t.Fatalf("closed with %d", reason)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("connection not ended")
	}
}

func TestShutdownTellsClientsToReconnect(t *testing.T) {
	e := newEnv(t, hub.Config{})
	var recs []*recorder
	var conns []*hub.Conn
	for range 20 {
		c, r, _ := e.open(t, "t1", "u1", hub.Subscription{Tasks: []string{"task_a"}})
		recs = append(recs, r)
		conns = append(conns, c)
	}
	// The transports close their connections when told to.
	var wg sync.WaitGroup
	for i, r := range recs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-r.closed
			conns[i].Close()
		}()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := e.hub.Shutdown(ctx, time.Second); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	for _, r := range recs {
		ev := r.next(t)
		if ev.Kind != hub.KindReconnect || ev.AfterMS < 1 || ev.AfterMS > 1000 {
			t.Fatalf("got %+v, want reconnect within 1s", ev)
		}
	}
	if _, err := e.hub.Open(hub.Principal{TenantID: "t1"}, newRecorder()); err != hub.ErrClosed {
		t.Fatalf("Open after Shutdown: %v", err)
	}
}

// seqSource answers Get with the snapshot the test set last, so the guard
// measures the hub and not the store's write path.
type seqSource struct {
	*snapshot.MemoryStore
	cur atomic.Pointer[snapshot.Snapshot]
}

func (s *seqSource) Get(context.Context, string, int64) (*snapshot.Snapshot, error) {
	return s.cur.Load(), nil
}

// TestSinceCannotGrowAConnectionWithoutBound: versions a client claims to
// hold are remembered only up to what a connection could hold, however
// many subscribes carry new ones.
func TestSinceCannotGrowAConnectionWithoutBound(t *testing.T) {
	e := newEnv(t, hub.Config{MaxSubscriptions: 10})
	c, _, _ := e.open(t, "t1", "u1", hub.Subscription{Tasks: []string{"a"}})
	for i := range 100 {
		since := make(map[string]int64, 100)
		for j := range 100 {
			since[fmt.Sprintf("claimed_%d_%d", i, j)] = 1
		}
		if _, err := c.Subscribe(context.Background(), hub.Subscription{Since: since}); err != nil {
			t.Fatal(err)
		}
	}
	if n, limit := hub.Remembered(c), 10+snapshot.MaxList; n > limit {
		t.Fatalf("10,000 claimed versions left %d remembered, want at most %d", n, limit)
	}
}

// A task is counted hot each time the connections watching it by id reach
// HotTaskWatchers, once per crossing: not again while it stays there, again
// after it fell below and came back. Watching its project does not count.
func TestHotTaskCountedOncePerCrossing(t *testing.T) {
	e := newEnv(t, hub.Config{HotTaskWatchers: 3})
	e.publish(t, snap(t, "t1", "task_a", 1))
	check := func(step string, hot int, detected int64) {
		t.Helper()
		st := e.hub.Stats()
		if st.HotTasks != hot || st.HotTasksDetected != detected {
			t.Fatalf("%s: hot %d, detected %d; want %d, %d", step, st.HotTasks, st.HotTasksDetected, hot, detected)
		}
	}
	byID := hub.Subscription{Tasks: []string{"task_a"}}
	var conns []*hub.Conn
	for range 2 {
		c, _, _ := e.open(t, "t1", "u1", byID)
		conns = append(conns, c)
	}
	e.open(t, "t1", "u1", hub.Subscription{Projects: []string{"p1"}})
	check("two by id, one by project", 0, 0)
	// Subscribing again to a task it watches adds no watcher.
	if _, err := conns[0].Subscribe(context.Background(), byID); err != nil {
		t.Fatal(err)
	}
	check("a repeated subscribe", 0, 0)
	c3, _, _ := e.open(t, "t1", "u1", byID)
	check("three", 1, 1)
	c4, _, _ := e.open(t, "t1", "u1", byID)
	check("four", 1, 1)
	c4.Close()
	check("back to three", 1, 1)
	c3.Close()
	check("two", 0, 1)
	c5, _, _ := e.open(t, "t1", "u1", byID)
	check("three again", 1, 2)
	c5.Unsubscribe([]string{"task_a"}, nil)
	check("unsubscribed to two", 0, 2)
	// Another tenant's task of the same id is another key.
	for range 3 {
		e.open(t, "t2", "u1", byID)
	}
	check("another tenant's", 1, 3)
}

// everyProject is the grant of the tests' connections that watch other
// users' tasks.
var everyProject = &snapshot.Grant{All: true}

// A connection sees its user's own tasks and its granted projects' only:
// a task of another project is refused as not found at subscribe, and
// none of its changes is delivered, by id, by project or after a move out
// of a granted project.
func TestGrantFiltersEveryDelivery(t *testing.T) {
	e := newEnv(t, hub.Config{})
	e.publish(t, snap(t, "t1", "task_p1", 1, "p1", "alice"))
	e.publish(t, snap(t, "t1", "task_p2", 1, "p2", "alice"))
	e.publish(t, snap(t, "t1", "task_own", 1, "p2", "bob"))
	grant, err := snapshot.ParseGrant([]string{"p1"})
	if err != nil {
		t.Fatal(err)
	}
	r := newRecorder()
	c, err := e.hub.Open(hub.Principal{TenantID: "t1", UserID: "bob", Grant: grant}, r)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	rej, err := c.Subscribe(context.Background(), hub.Subscription{Tasks: []string{"task_p1", "task_p2", "task_own"}, Projects: []string{"p2"}})
	if err != nil || len(rej) != 1 || rej[0].TaskID != "task_p2" || rej[0].Code != hub.CodeNotFound {
		t.Fatalf("Subscribe = %+v, %v; want task_p2 refused as not found", rej, err)
	}
	got := map[string]bool{}
	for range 2 {
		got[r.nextTask(t).TaskID] = true
	}
	if !got["task_p1"] || !got["task_own"] {
		t.Fatalf("initial state %v, want task_p1 and task_own", got)
	}
	hidden := e.hub.Stats().Dropped[hub.DropGrant]
	e.publish(t, snap(t, "t1", "task_p2", 2, "p2", "alice"))
	e.publish(t, snap(t, "t1", "task_p1", 2, "p2", "alice")) // moved out of p1
	// Read side by side by the dispatchers: both hidden changes are known
	// dropped once counted, and the next change must then come alone.
	testenv.Eventually(t, "the two hidden changes counted as dropped by grant", func() bool {
		return e.hub.Stats().Dropped[hub.DropGrant] >= hidden+2
	})
	e.publish(t, snap(t, "t1", "task_own", 2, "p2", "bob"))
	if s := r.nextTask(t); s.TaskID != "task_own" || s.Version != 2 {
		t.Fatalf("got %s v%d, want task_own v2 alone", s.TaskID, s.Version)
	}
}
