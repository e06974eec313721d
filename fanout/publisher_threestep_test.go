package fanout

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/pushd/pushd/internal/testenv"
	"github.com/pushd/pushd/keys"
	"github.com/pushd/pushd/snapshot"
	"github.com/pushd/pushd/snapshot/rediswrite"
)

// threeStepFixture is a mode whose publish takes three steps, with a bus
// subscribed to its tenants: Redis Cluster (tenants on every master), or
// split standalone Redis (snapshots on the shared Redis, the journal and
// Pub/Sub on a private one).
type threeStepFixture struct {
	snapshots, realtime redis.UniversalClient
	names               keys.Names
	pub                 *RedisPublisher
	notes               <-chan snapshot.Notification
	tenants             []string
}

// threeStepModes runs test on Redis Cluster and on split Redis.
func threeStepModes(t *testing.T, test func(t *testing.T, f *threeStepFixture)) {
	t.Run("cluster", func(t *testing.T) {
		c := newClusterFixture(t, 1)
		for _, tenant := range c.tenants {
			mustSubscribe(t, c.bus, tenant)
		}
		test(t, &threeStepFixture{snapshots: c.cl, realtime: c.cl, names: clusterNames,
			pub: NewRedisPublisher(c.cl, clusterNames), notes: c.r.notes, tenants: c.tenants})
		c.noCrossSlot(t)
	})
	t.Run("split", func(t *testing.T) {
		cache := testenv.SharedRedis(t)
		realtime := testenv.StartRedis(t).Client()
		b, r := newBus(t, realtime, cache.Names, BusConfig{})
		tenants := []string{testenv.UniqueID("tenant"), testenv.UniqueID("tenant")}
		for _, tenant := range tenants {
			mustSubscribe(t, b, tenant)
		}
		test(t, &threeStepFixture{snapshots: cache.Client, realtime: realtime, names: cache.Names,
			pub: NewSplitRedisPublisher(cache.Client, realtime, cache.Names), notes: r.notes, tenants: tenants})
	})
}

// journal returns the entries of tenant's journal.
func (f *threeStepFixture) journal(t *testing.T, tenant string) []redis.Z {
	t.Helper()
	zs, err := f.realtime.ZRangeWithScores(testContext(t), f.names.Unannounced(tenant), 0, -1).Result()
	if err != nil {
		t.Fatal(err)
	}
	return zs
}

// heard waits for the next notification and fails unless it is v of
// tenant's task: notifications of one client, sent one after the other,
// arrive in order, so any other announcement made in between would come
// first.
func (f *threeStepFixture) heard(t *testing.T, tenant string, v int64) {
	t.Helper()
	n := next(t, f.notes, fmt.Sprintf("v%d of %s", v, tenant))
	if n.TenantID != tenant || n.TaskID != "task-"+tenant || n.Version != v {
		t.Fatalf("heard %+v, want v%d of %s", n, v, tenant)
	}
}

// A publish, written or stale, leaves no journal entry, and costs one round
// trip more than before the journal: journal, write, announce (a stale one:
// journal, write, forget).
func TestThreeStepPublishLeavesNoJournal(t *testing.T) {
	threeStepModes(t, func(t *testing.T, f *threeStepFixture) {
		ctx := testContext(t)
		var calls atomic.Int64
		count := countingHook{&calls}
		var pub *RedisPublisher
		if cl, ok := f.realtime.(*redis.ClusterClient); ok {
			counted := redis.NewClusterClient(cl.Options())
			t.Cleanup(func() { counted.Close() })
			counted.AddHook(count)
			pub = NewRedisPublisher(counted, f.names)
		} else {
			counted := []*redis.Client{
				redis.NewClient(f.snapshots.(*redis.Client).Options()),
				redis.NewClient(f.realtime.(*redis.Client).Options()),
			}
			for _, c := range counted {
				t.Cleanup(func() { c.Close() })
				c.AddHook(count)
			}
			pub = NewSplitRedisPublisher(counted[0], counted[1], f.names)
		}
		for _, tenant := range f.tenants {
			task := "task-" + tenant
			// The first written and the first stale publish load the
			// scripts where they are missing; the last two are counted.
			for i, step := range []struct {
				version int64
				written bool
			}{{2, true}, {1, false}, {3, true}, {1, false}} {
				calls.Store(0)
				written, err := pub.Publish(ctx, testSnapshot(t, tenant, task, step.version))
				if err != nil || written != step.written {
					t.Fatalf("%s: publish v%d = %v, %v; want %v", tenant, step.version, written, err, step.written)
				}
				if step.written {
					f.heard(t, tenant, step.version)
				}
				if n := calls.Load(); i >= 2 && n != 3 {
					t.Fatalf("%s: publish v%d took %d round trips, want 3", tenant, step.version, n)
				}
				if zs := f.journal(t, tenant); len(zs) != 0 {
					t.Fatalf("%s: journal %v after publish v%d, want it empty", tenant, zs, step.version)
				}
			}
		}
	})
}

// countingHook counts the commands and pipelines a client sends, each one
// round trip.
type countingHook struct{ n *atomic.Int64 }

func (h countingHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h countingHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.n.Add(1)
		return next(ctx, cmd)
	}
}

func (h countingHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.n.Add(1)
		return next(ctx, cmds)
	}
}

// An earlier publish's announcement never removes the entry of a later
// publish still in flight, whether of a newer version (another member) or
// a retry of the same one (a higher score): the later publisher dies after
// its write, and its entry stays for the nodes' reconcile.
func TestAnnounceKeepsALaterPublishInFlight(t *testing.T) {
	threeStepModes(t, func(t *testing.T, f *threeStepFixture) {
		ctx := testContext(t)
		tenant := f.tenants[0]
		task := "task-" + tenant
		s1, s2 := testSnapshot(t, tenant, task, 1), testSnapshot(t, tenant, task, 2)
		p1, err := f.pub.journal(ctx, s1)
		if err != nil {
			t.Fatal(err)
		}
		p2, err := f.pub.journal(ctx, s2) // a later publish of v2 begins
		if err != nil {
			t.Fatal(err)
		}
		retry, err := f.pub.journal(ctx, s1) // and a retry of v1
		if err != nil || retry.Since <= p1.Since {
			t.Fatalf("retry's journal = %+v, %v; want a score above %d", retry, err, p1.Since)
		}
		out, err := f.pub.write(ctx, s1, p1)
		if err != nil {
			t.Fatal(err)
		}
		if err := f.pub.announce(ctx, s1, out, p1, mustNotification(t, s1)); err != nil {
			t.Fatal(err)
		}
		f.heard(t, tenant, 1)
		want := map[string]float64{task + " 1": float64(retry.Since), task + " 2": float64(p2.Since)}
		if zs := f.journal(t, tenant); len(zs) != 2 || want[zs[0].Member.(string)] != zs[0].Score || want[zs[1].Member.(string)] != zs[1].Score {
			t.Fatalf("journal %v after v1's announcement, want the retry's and v2's entries %v", zs, want)
		}
		if _, err := f.pub.write(ctx, s2, p2); err != nil {
			t.Fatal(err)
		}
		// v2's publisher dies here; the retry of v1 finds v2 stored, and
		// removes its own entry only.
		if out, err := f.pub.write(ctx, s1, retry); err != nil || out != rediswrite.Stale {
			t.Fatalf("retry of v1 = %v, %v; want stale", out, err)
		}
		// v2's entry is left for the nodes' reconcile, which announces it
		// (converge.Reconciler).
		if zs := f.journal(t, tenant); len(zs) != 1 || zs[0].Member != task+" 2" || zs[0].Score != float64(p2.Since) {
			t.Fatalf("journal %v after v2's publisher died, want v2's entry alone, scored %d", zs, p2.Since)
		}
	})
}

func mustNotification(t *testing.T, s *snapshot.Snapshot) []byte {
	t.Helper()
	msg, err := notificationMessage(s)
	if err != nil {
		t.Fatal(err)
	}
	return msg
}
