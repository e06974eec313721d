package converge

import (
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pushd/pushd/fanout"
	"github.com/pushd/pushd/internal/testenv"
	"github.com/pushd/pushd/keys"
	"github.com/pushd/pushd/snapshot"
	"github.com/pushd/pushd/snapshot/rediswrite"
)

var clusterNames = keys.Names{Cluster: true}

// threeStepFixture is a mode whose publish takes three steps, with a bus
// subscribed to its tenants: Redis Cluster (tenants on every master), or
// split standalone Redis (snapshots on the shared Redis, the journal and
// Pub/Sub on a private one).
type threeStepFixture struct {
	snapshots, realtime redis.UniversalClient
	names               keys.Names
	pub                 *fanout.RedisPublisher
	bus                 interface{ Subscribed() []string }
	notes               <-chan snapshot.Notification
	tenants             []string
}

// notes is a bus's Handler that hands what it hears to a channel.
type notes chan snapshot.Notification

func (n notes) Notify(s snapshot.Notification) {
	select {
	case n <- s:
	default: // the tests hear a few; a full channel fails them by what is missing
	}
}

func (n notes) Resync(string) {}

// startBus starts b delivering to a channel and subscribes tenants.
func startBus(t *testing.T, b fanout.Bus, tenants []string) <-chan snapshot.Notification {
	t.Helper()
	ch := make(notes, 64)
	b.Start(ch)
	t.Cleanup(func() { b.Close() })
	for _, tenant := range tenants {
		if _, err := b.Subscribe(testenv.Context(t), tenant); err != nil {
			t.Fatalf("subscribe %s: %v", tenant, err)
		}
	}
	return ch
}

// threeStepModes runs test on Redis Cluster and on split Redis.
func threeStepModes(t *testing.T, test func(t *testing.T, f *threeStepFixture)) {
	t.Run("cluster", func(t *testing.T) {
		c := testenv.StartRedisCluster(t, 3)
		cl := c.Client()
		tenants, _ := c.Spread(1, func(i int) string { return fmt.Sprintf("t%d", i) }, clusterNames.Channel)
		b := fanout.NewClusterBus(fanout.BusConfig{Client: cl, Names: clusterNames, Linger: 200 * time.Millisecond})
		test(t, &threeStepFixture{snapshots: cl, realtime: cl, names: clusterNames,
			pub: fanout.NewRedisPublisher(cl, clusterNames), bus: b, notes: startBus(t, b, tenants), tenants: tenants})
		if n := c.ErrorCount("CROSSSLOT"); n != 0 {
			t.Fatalf("the cluster answered CROSSSLOT %d times", n)
		}
	})
	t.Run("split", func(t *testing.T) {
		cache := testenv.SharedRedis(t)
		realtime := testenv.StartRedis(t).Client()
		b := fanout.NewRedisBus(fanout.BusConfig{Client: realtime, Names: cache.Names})
		tenants := []string{testenv.UniqueID("tenant"), testenv.UniqueID("tenant")}
		test(t, &threeStepFixture{snapshots: cache.Client, realtime: realtime, names: cache.Names,
			pub: fanout.NewSplitRedisPublisher(cache.Client, realtime, cache.Names), bus: b, notes: startBus(t, b, tenants), tenants: tenants})
	})
}

// reconciler is a Reconciler of f's tenants with a short grace. It is not
// started: tests run its rounds.
func (f *threeStepFixture) reconciler(grace time.Duration) *Reconciler {
	return NewReconciler(ReconcileConfig{Snapshots: f.snapshots, Realtime: f.realtime, Names: f.names,
		Tenants: f.bus.Subscribed, Interval: 20 * time.Millisecond, Grace: grace})
}

// journal returns the entries of tenant's journal.
func (f *threeStepFixture) journal(t *testing.T, tenant string) []redis.Z {
	t.Helper()
	zs, err := f.realtime.ZRangeWithScores(testenv.Context(t), f.names.Unannounced(tenant), 0, -1).Result()
	if err != nil {
		t.Fatal(err)
	}
	return zs
}

// next is the next notification heard.
func (f *threeStepFixture) next(t *testing.T, what string) snapshot.Notification {
	t.Helper()
	select {
	case n := <-f.notes:
		return n
	case <-time.After(testenv.Wait):
		t.Fatalf("no %s within %v", what, testenv.Wait)
		return snapshot.Notification{}
	}
}

// heard waits for the next notification and fails unless it is v of
// tenant's task: notifications of one client, sent one after the other,
// arrive in order, so any other announcement made in between would come
// first.
func (f *threeStepFixture) heard(t *testing.T, tenant string, v int64) {
	t.Helper()
	n := f.next(t, fmt.Sprintf("v%d of %s", v, tenant))
	if n.TenantID != tenant || n.TaskID != "task-"+tenant || n.Version != v {
		t.Fatalf("heard %+v, want v%d of %s", n, v, tenant)
	}
}

// journalAndWrite takes a three-step publish's first two steps, journal and
// write, as a publisher that dies before the third.
func (f *threeStepFixture) journalAndWrite(t *testing.T, s *snapshot.Snapshot) {
	t.Helper()
	ctx := testenv.Context(t)
	if _, err := rediswrite.Journal(ctx, f.realtime, f.names, s); err != nil {
		t.Fatal(err)
	}
	if out, err := rediswrite.WriteIfNewer(ctx, f.snapshots, f.names, s, 0); err != nil || out != rediswrite.Written {
		t.Fatalf("%s: write = %v, %v", s.TenantID, out, err)
	}
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

// A publisher that dies between the snapshot write and its announcement
// leaves its journal entry; a node's reconcile, started after, announces
// the stored version and removes the entry. The stand-in for a watching
// node is a bus subscribed to the tenant.
func TestReconcileAnnouncesAWriteNeverAnnounced(t *testing.T) {
	threeStepModes(t, func(t *testing.T, f *threeStepFixture) {
		ctx := testenv.Context(t)
		for _, tenant := range f.tenants {
			f.journalAndWrite(t, testSnapshot(t, tenant, "task-"+tenant, 3))
			// The publisher dies here.
			if zs := f.journal(t, tenant); len(zs) != 1 || zs[0].Member != "task-"+tenant+" 3" {
				t.Fatalf("%s: journal %v, want the pending v3", tenant, zs)
			}
			if ttl := f.realtime.PTTL(ctx, f.names.Unannounced(tenant)).Val(); ttl <= 0 || ttl > rediswrite.JournalTTL {
				t.Fatalf("%s: journal PTTL %v, want at most %v", tenant, ttl, rediswrite.JournalTTL)
			}
		}
		select {
		case n := <-f.notes:
			t.Fatalf("notification before the reconcile: %+v", n)
		default:
		}

		rc := f.reconciler(50 * time.Millisecond)
		rc.Start()
		t.Cleanup(rc.Close)
		announced := map[string]bool{}
		for range f.tenants {
			n := f.next(t, "a repaired announcement")
			if n.TaskID != "task-"+n.TenantID || n.Version != 3 || n.Status != "RUNNING" {
				t.Fatalf("heard %+v, want v3 of a tenant's task", n)
			}
			announced[n.TenantID] = true
		}
		for _, tenant := range f.tenants {
			if !announced[tenant] {
				t.Fatalf("%s was not announced (heard %v)", tenant, announced)
			}
			testenv.Eventually(t, tenant+"'s journal empty", func() bool { return len(f.journal(t, tenant)) == 0 })
		}
		rc.Close()
		if st := rc.Stats(); st.Repairs != uint64(len(f.tenants)) || st.Rounds == 0 {
			t.Fatalf("stats %+v, want a repair per tenant", st)
		}
	})
}

// A publisher that dies between the journal and the write leaves an entry
// whose version is not stored: the reconcile announces nothing, keeps the
// entry while it is younger than the abandon age (its write may still be
// coming), then removes it. Entries are aged by rewriting their score.
func TestReconcileForgetsAPublishNeverWritten(t *testing.T) {
	threeStepModes(t, func(t *testing.T, f *threeStepFixture) {
		ctx := testenv.Context(t)
		tenant := f.tenants[0]
		task := "task-" + tenant
		if _, err := f.pub.Publish(ctx, testSnapshot(t, tenant, task, 1)); err != nil {
			t.Fatal(err)
		}
		f.heard(t, tenant, 1)
		if _, err := rediswrite.Journal(ctx, f.realtime, f.names, testSnapshot(t, tenant, task, 2)); err != nil {
			t.Fatal(err)
		}
		// The publisher dies here.
		age := func(d time.Duration) {
			t.Helper()
			z := redis.Z{Score: float64(time.Now().Add(-d).UnixMilli()), Member: task + " 2"}
			if err := f.realtime.ZAddXX(ctx, f.names.Unannounced(tenant), z).Err(); err != nil {
				t.Fatal(err)
			}
		}
		rc := f.reconciler(time.Second)
		age(2 * time.Second)
		if err := rc.round(ctx); err != nil {
			t.Fatal(err)
		}
		if zs := f.journal(t, tenant); len(zs) != 1 {
			t.Fatalf("journal %v after a round, want the young entry kept", zs)
		}
		age(abandonAge + time.Second)
		if err := rc.round(ctx); err != nil {
			t.Fatal(err)
		}
		if zs := f.journal(t, tenant); len(zs) != 0 {
			t.Fatalf("journal %v, want the abandoned entry removed", zs)
		}
		if st := rc.Stats(); st.Repairs != 0 || st.Abandoned != 1 || st.Errors != 0 {
			t.Fatalf("stats %+v, want one abandoned entry and no repair", st)
		}
		// Nothing was announced: the next notification is v3's.
		if _, err := f.pub.Publish(ctx, testSnapshot(t, tenant, task, 3)); err != nil {
			t.Fatal(err)
		}
		f.heard(t, tenant, 3)
	})
}

// A later publish still in flight when an earlier one of the same task
// completes keeps its entry (fanout's TestAnnounceKeepsALaterPublishInFlight
// shows the journal); when its publisher dies after its write, the
// reconcile announces it.
func TestReconcileAnnouncesALaterPublishLeftInFlight(t *testing.T) {
	threeStepModes(t, func(t *testing.T, f *threeStepFixture) {
		ctx := testenv.Context(t)
		tenant := f.tenants[0]
		task := "task-" + tenant
		s2 := testSnapshot(t, tenant, task, 2)
		p2, err := rediswrite.Journal(ctx, f.realtime, f.names, s2) // a later publish of v2 begins
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.pub.Publish(ctx, testSnapshot(t, tenant, task, 1)); err != nil {
			t.Fatal(err)
		}
		f.heard(t, tenant, 1)
		if out, err := rediswrite.WriteIfNewer(ctx, f.snapshots, f.names, s2, 0); err != nil || out != rediswrite.Written {
			t.Fatalf("write v2 = %v, %v", out, err)
		}
		// v2's publisher dies here.
		rc := f.reconciler(time.Millisecond)
		testenv.Eventually(t, "v2's entry older than the grace", func() bool { return time.Now().UnixMilli() > p2.Since+1 })
		if err := rc.round(ctx); err != nil {
			t.Fatal(err)
		}
		f.heard(t, tenant, 2)
		if zs := f.journal(t, tenant); len(zs) != 0 {
			t.Fatalf("journal %v after the reconcile, want it empty", zs)
		}
	})
}
