package stream_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/pushd/pushd/fanout"
	"github.com/pushd/pushd/hub"
	"github.com/pushd/pushd/internal/testenv"
	"github.com/pushd/pushd/snapshot"
	"github.com/pushd/pushd/stream"
	"github.com/pushd/pushd/stream/cursor"
)

var (
	_ hub.Stream    = (*stream.Tailer)(nil)
	_ stream.Target = (*hub.Hub)(nil)
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const waitFor = 10 * time.Second

// target records what a Tailer delivers.
type target struct {
	mu      sync.Mutex
	changes []snapshot.Notification
	arrived []time.Time // when each of changes was applied
	resyncs []string
	events  []snapshot.Notification // changes and re-reads in order; a re-read has version 0
	changed chan struct{}           // cap 1
}

func newTarget() *target { return &target{changed: make(chan struct{}, 1)} }

func (g *target) Apply(_ context.Context, _ string, changes []snapshot.Notification) error {
	g.mu.Lock()
	g.changes = append(g.changes, changes...)
	now := time.Now()
	for range changes {
		g.arrived = append(g.arrived, now)
	}
	g.events = append(g.events, changes...)
	g.mu.Unlock()
	g.signal()
	return nil
}

func (g *target) ResyncNow(tenant string) bool {
	g.mu.Lock()
	g.resyncs = append(g.resyncs, tenant)
	g.events = append(g.events, snapshot.Notification{TenantID: tenant})
	g.mu.Unlock()
	g.signal()
	return true
}

func (g *target) signal() {
	select {
	case g.changed <- struct{}{}:
	default:
	}
}

// waitUntil waits for cond, re-checked on every delivery and every 50ms.
func (g *target) waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.NewTimer(waitFor)
	defer deadline.Stop()
	tick := time.NewTicker(50 * time.Millisecond) // Position and Covers change without a delivery
	defer tick.Stop()
	for {
		g.mu.Lock()
		ok := cond()
		g.mu.Unlock()
		if ok {
			return
		}
		select {
		case <-g.changed:
		case <-tick.C:
		case <-deadline.C:
			t.Fatalf("not within %v: %s", waitFor, what)
		}
	}
}

func snap(t *testing.T, tenant, task string, version int64) *snapshot.Snapshot {
	t.Helper()
	s, err := snapshot.Parse(fmt.Appendf(nil, `{"task_id":%q,"tenant_id":%q,"project_id":"p1","user_id":"u1","status":"RUNNING","version":%d,"updated_at":1710000000000}`, task, tenant, version))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	t.Cleanup(cancel)
	return ctx
}

func TestTailDeliversInOrderAndGivesPositions(t *testing.T) {
	r := testenv.SharedRedis(t)
	ctx := ctxT(t)
	pub := fanout.NewRedisPublisher(r.Client, r.Names, fanout.WithStream(1000))
	tenant := testenv.UniqueID("tenant")
	// Published before the tail starts: never delivered, it is the
	// watchers' initial state.
	if _, err := pub.Publish(ctx, snap(t, tenant, "before", 1)); err != nil {
		t.Fatal(err)
	}
	tl := stream.NewTailer(stream.Config{Client: r.Client, Names: r.Names, Readers: 2, Block: 100 * time.Millisecond})
	g := newTarget()
	tl.Start(g)
	defer tl.Close()
	release, err := tl.Watch(ctx, tenant)
	if err != nil {
		t.Fatal(err)
	}
	defer release()
	p0 := tl.Position(tenant)
	if !cursor.Is(p0) {
		t.Fatalf("position after placement %q, want a cursor", p0)
	}
	for v := int64(1); v <= 20; v++ {
		if _, err := pub.Publish(ctx, snap(t, tenant, "task_a", v)); err != nil {
			t.Fatal(err)
		}
	}
	g.waitUntil(t, "20 changes delivered", func() bool { return len(g.changes) >= 20 })
	for i, n := range g.changes {
		if n.TaskID != "task_a" || n.Version != int64(i+1) || n.TenantID != tenant || n.ProjectID != "p1" || n.UserID != "u1" {
			t.Fatalf("change %d: %+v", i, n)
		}
	}
	if len(g.changes) != 20 {
		t.Fatalf("%d changes delivered, want 20", len(g.changes))
	}
	// The position moves once a batch is applied, so it may still name an
	// earlier batch just after the last change arrived: a replay from it,
	// which returns nothing only once it names the last entry, is what to
	// wait for.
	g.waitUntil(t, "a replay from the position returns nothing", func() bool {
		changes, _, reason := tl.Replay(ctx, tenant, tl.Position(tenant), 0)
		return reason == "" && len(changes) == 0 && tl.Covers(tenant)
	})

	// Replay from the placement's position returns the 20 changes. The
	// wait above replays too, and a replay from a position one batch
	// behind returns that batch: the replay counters are compared across
	// this one replay only.
	before := tl.Stats()
	changes, held, reason := tl.Replay(ctx, tenant, p0, 0)
	if reason != "" || len(changes) != 20 || len(held) != 0 {
		t.Fatalf("replay from the start: %d changes, %d held, reason %q; want 20 and none held without a window", len(changes), len(held), reason)
	}
	s := tl.Stats()
	if s.Entries != 20 || s.Lag.Count != 20 || s.Replays != before.Replays+1 || s.Replayed != before.Replayed+20 {
		t.Fatalf("stats %+v, before the last replay %+v: want 20 entries tailed, and one replay of 20", s, before)
	}

	// From the last position with a window, the changes at or before it
	// are what the client holds, newest first: the 20, then the one
	// published before the tail.
	changes, held, reason = tl.Replay(ctx, tenant, tl.Position(tenant), time.Minute)
	if reason != "" || len(changes) != 0 || len(held) != 21 || held[0].Version != 20 || held[19].Version != 1 || held[20].TaskID != "before" {
		t.Fatalf("replay from the end with a window: %d changes, held %+v, reason %q; want none after, the 21 before, newest first", len(changes), held, reason)
	}
	if s := tl.Stats(); s.ReplayedHeld != before.ReplayedHeld+21 {
		t.Fatalf("%d entries read before the cursor, want 21", s.ReplayedHeld-before.ReplayedHeld)
	}
}

// Every cursor the stream cannot serve is answered with a reason, never
// with another tenant's entries.
func TestReplayFallbacks(t *testing.T) {
	r := testenv.SharedRedis(t)
	ctx := ctxT(t)
	pub := fanout.NewRedisPublisher(r.Client, r.Names, fanout.WithStream(1000))
	a, b := testenv.UniqueID("tenant"), testenv.UniqueID("tenant")
	for _, tenant := range []string{a, b} {
		if _, err := pub.Publish(ctx, snap(t, tenant, "task_"+tenant, 1)); err != nil {
			t.Fatal(err)
		}
	}
	tl := stream.NewTailer(stream.Config{Client: r.Client, Names: r.Names, Readers: 1, Block: 100 * time.Millisecond, MaxReplay: 5, CheckInterval: 200 * time.Millisecond})
	g := newTarget()
	tl.Start(g)
	defer tl.Close()
	ra, _ := tl.Watch(ctx, a)
	defer ra()
	rb, _ := tl.Watch(ctx, b)
	defer rb()
	curA, curB := tl.Position(a), tl.Position(b)

	if _, _, reason := tl.Replay(ctx, a, curB, 0); reason != stream.FallbackTenant {
		t.Fatalf("another tenant's cursor: reason %q", reason)
	}
	for _, bad := range []string{"s1.", "s1.AAAAAAAAAAAAAAAA", curA + "x", "s1." + curA} {
		if _, _, reason := tl.Replay(ctx, a, bad, 0); reason != stream.FallbackCorrupt {
			t.Fatalf("corrupt cursor %q: reason %q", bad, reason)
		}
	}
	for v := int64(2); v <= 8; v++ {
		pub.Publish(ctx, snap(t, a, "task_"+a, v))
	}
	if _, _, reason := tl.Replay(ctx, a, curA, time.Minute); reason != stream.FallbackTooMany {
		t.Fatalf("7 entries behind with MaxReplay 5: reason %q", reason)
	}
	// Trimmed: everything but the newest entry goes.
	if err := r.Client.XTrimMaxLen(ctx, r.Names.Stream(a), 1).Err(); err != nil {
		t.Fatal(err)
	}
	if _, _, reason := tl.Replay(ctx, a, curA, time.Minute); reason != stream.FallbackTrimmed {
		t.Fatalf("trimmed cursor: reason %q", reason)
	}
	// Recreated: the stream is lost and written again.
	if err := r.Client.Del(ctx, r.Names.Stream(b)).Err(); err != nil {
		t.Fatal(err)
	}
	if _, _, reason := tl.Replay(ctx, b, curB, time.Minute); reason != stream.FallbackEpoch {
		t.Fatalf("cursor of a lost stream: reason %q", reason)
	}
	pub.Publish(ctx, snap(t, b, "task_"+b, 2))
	if _, _, reason := tl.Replay(ctx, b, curB, time.Minute); reason != stream.FallbackEpoch {
		t.Fatalf("cursor of a recreated stream: reason %q", reason)
	}
	s := tl.Stats()
	if s.ResumeFallbacks[stream.FallbackTenant] != 1 || s.ResumeFallbacks[stream.FallbackCorrupt] != 4 ||
		s.ResumeFallbacks[stream.FallbackTooMany] != 1 || s.ResumeFallbacks[stream.FallbackTrimmed] != 1 ||
		s.ResumeFallbacks[stream.FallbackEpoch] != 2 || s.Replays != 0 {
		t.Fatalf("stats %+v", s)
	}

	// The tail of b notices the recreation at its next check and re-reads
	// the tenant; a's tail notices nothing wrong (it read every entry).
	g.waitUntil(t, "b re-read after its stream was recreated", func() bool {
		for _, ten := range g.resyncs {
			if ten == b {
				return true
			}
		}
		return false
	})
}

// Close ends every reader, even one blocked in XREAD, and later calls are
// harmless; goleak in TestMain checks that nothing is left running.
func TestCloseEndsTheReaders(t *testing.T) {
	r := testenv.SharedRedis(t)
	ctx := ctxT(t)
	tl := stream.NewTailer(stream.Config{Client: r.Client, Names: r.Names, Readers: 3, Block: time.Minute})
	tl.Start(newTarget())
	var releases []func()
	for range 5 {
		release, err := tl.Watch(ctx, testenv.UniqueID("tenant"))
		if err != nil {
			t.Fatal(err)
		}
		releases = append(releases, release)
	}
	// Wait until some reader is inside its minute-long XREAD.
	testenv.EventuallyWithin(t, "a reader blocked in XREAD", waitFor, func() bool { return tl.Stats().Reads > 0 || blocked(t, r.Client) })
	if err := tl.Close(); err != nil {
		t.Fatal(err)
	}
	tl.Close()
	for _, release := range releases {
		release()
	}
	if _, err := tl.Watch(ctx, "t1"); err != stream.ErrClosed {
		t.Fatalf("Watch after Close: %v, want ErrClosed", err)
	}
}

// blocked reports whether a client of the server is blocked in XREAD.
func blocked(t *testing.T, c interface {
	ClientList(context.Context) *redis.StringCmd
}) bool {
	list, err := c.ClientList(context.Background()).Result()
	if err != nil {
		t.Fatal(err)
	}
	return strings.Contains(list, "cmd=xread")
}
