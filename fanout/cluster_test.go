package fanout

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pushd/pushd/internal/testenv"
	"github.com/pushd/pushd/keys"
)

var clusterNames = keys.Names{Cluster: true}

// clusterFixture is a private three-master cluster with a ClusterBus on it
// and tenants whose channels live on every master.
type clusterFixture struct {
	c       *testenv.RedisCluster
	cl      *redis.ClusterClient
	bus     *ClusterBus
	r       *recorder
	pub     *RedisPublisher
	byOwner map[string][]string // master address → tenants whose slot it serves
	tenants []string
	handler Handler // what the bus delivers to, when set before Start: else r
}

func newClusterFixture(t *testing.T, perMaster int) *clusterFixture {
	t.Helper()
	return newClusterFixtureWith(t, perMaster, BusConfig{}, nil)
}

// newClusterFixtureWith is newClusterFixture with the bus configured by cfg
// (Client, Names, Linger and Logger are the fixture's) and, when before is
// set, prepared by it before Start.
func newClusterFixtureWith(t *testing.T, perMaster int, cfg BusConfig, before func(*clusterFixture, *ClusterBus)) *clusterFixture {
	t.Helper()
	c := testenv.StartRedisCluster(t, 3)
	cl := c.Client()
	f := &clusterFixture{c: c, cl: cl, r: newRecorder(t), pub: NewRedisPublisher(cl, clusterNames)}
	f.tenants, f.byOwner = c.Spread(perMaster, func(i int) string { return fmt.Sprintf("t%d", i) }, clusterNames.Channel)
	cfg.Client, cfg.Names, cfg.Linger = cl, clusterNames, 200*time.Millisecond
	cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	f.bus = NewClusterBus(cfg)
	if before != nil {
		before(f, f.bus)
	}
	var h Handler = f.r
	if f.handler != nil {
		h = f.handler
	}
	f.bus.Start(h)
	t.Cleanup(func() { closeBus(t, f.bus) })
	return f
}

// publishAll publishes version v of one task per tenant, retrying while the
// cluster fails over (the test's client may still know the old master),
// and waits until every notification was heard.
func (f *clusterFixture) publishAll(t *testing.T, tenants []string, v int64) {
	t.Helper()
	ctx := testContext(t)
	for _, tenant := range tenants {
		s := testSnapshot(t, tenant, "task-"+tenant, v)
		written := false
		err := testenv.Retry(ctx, func() error {
			var err error
			if written, err = f.pub.Publish(ctx, s); err != nil {
				f.cl.ReloadState(ctx)
			}
			return err
		})
		if err != nil {
			t.Fatalf("publish %s v%d: %v", tenant, v, err)
		}
		if !written {
			t.Fatalf("publish %s v%d: not written", tenant, v)
		}
	}
	want := map[string]bool{}
	for _, tenant := range tenants {
		want[tenant] = true
	}
	for len(want) > 0 {
		n := next(t, f.r.notes, fmt.Sprintf("notifications of version %d (missing %v)", v, want))
		if n.Version == v && n.TaskID == "task-"+n.TenantID {
			delete(want, n.TenantID)
		}
	}
}

// noCrossSlot fails if any running node answered CROSSSLOT.
func (f *clusterFixture) noCrossSlot(t *testing.T) {
	t.Helper()
	if n := f.c.ErrorCount("CROSSSLOT"); n != 0 {
		t.Fatalf("the cluster answered CROSSSLOT %d times", n)
	}
}

// resyncsOf collects n Resync calls and returns the tenants, sorted.
func resyncsOf(t *testing.T, r *recorder, n int) []string {
	t.Helper()
	var got []string
	for range n {
		got = append(got, next(t, r.resyncs, "resync"))
	}
	slices.Sort(got)
	return got
}

// Every master's tenants are subscribed on a connection to that master,
// one connection per master, and every publish reaches the bus.
func TestClusterBusDeliversFromEveryMaster(t *testing.T) {
	f := newClusterFixture(t, 3)
	for _, tenant := range f.tenants {
		mustSubscribe(t, f.bus, tenant)
	}
	masters := make([]string, 0, 3)
	for _, m := range f.c.Masters() {
		masters = append(masters, m.Addr)
	}
	slices.Sort(masters)
	if got := f.bus.Shards(); !slices.Equal(got, masters) {
		t.Fatalf("shard connections to %v, want one to each master %v", got, masters)
	}
	for owner, tenants := range f.byOwner {
		for _, tenant := range tenants {
			m := redis.NewClient(&redis.Options{Addr: owner})
			n, err := m.PubSubShardNumSub(testContext(t), clusterNames.Channel(tenant)).Result()
			m.Close()
			if err != nil || n[clusterNames.Channel(tenant)] != 1 {
				t.Fatalf("%s on its master %s: %v subscribers, %v; want 1", tenant, owner, n, err)
			}
		}
	}
	f.publishAll(t, f.tenants, 1)
	f.publishAll(t, f.tenants, 2)
	f.noCrossSlot(t)
	if s := f.bus.Stats(); s.Subscribes != int64(len(f.tenants)) || s.Losses != 0 || s.Resyncs != 0 {
		t.Fatalf("stats %+v: want %d subscribes, no loss, no resync", s, len(f.tenants))
	}
}

// A master dies: its replica takes over, the bus reports the loss, moves
// the dead master's tenants to the promoted replica, resyncs exactly those,
// and publishes after the failover reach it.
func TestClusterBusFailover(t *testing.T) {
	f := newClusterFixture(t, 2)
	for _, tenant := range f.tenants {
		mustSubscribe(t, f.bus, tenant)
	}
	f.publishAll(t, f.tenants, 1)

	f.c.WaitReplicated()
	victim := f.c.Masters()[0]
	orphans := slices.Clone(f.byOwner[victim.Addr])
	slices.Sort(orphans)
	victim.Stop()

	next(t, f.r.lost, "Lost after the master died")
	next(t, f.r.restored, "Restored after the failover")
	if got := resyncsOf(t, f.r, len(orphans)); !slices.Equal(got, orphans) {
		t.Fatalf("resynced %v, want the dead master's tenants %v", got, orphans)
	}
	f.c.WaitOK()
	f.publishAll(t, f.tenants, 2)
	none(t, f.r.resyncs, "resync of a tenant whose master lived")
	if got := f.bus.Shards(); slices.Contains(got, victim.Addr) || len(got) != 3 {
		t.Fatalf("shards %v after the failover: want the three live masters", got)
	}
	f.noCrossSlot(t)
}

// A slot migrated by hand: its master drops the channel (sunsubscribe), the
// bus subscribes it on the new owner and resyncs that tenant only; no loss
// is reported and the other tenants of the old master are untouched.
func TestClusterBusSlotMigration(t *testing.T) {
	f := newClusterFixture(t, 2)
	for _, tenant := range f.tenants {
		mustSubscribe(t, f.bus, tenant)
	}
	moved := f.tenants[0]
	to := f.c.OtherMaster(f.c.MasterOf(clusterNames.Channel(moved)))
	f.c.MoveSlot(clusterNames.Channel(moved), to)

	if got := next(t, f.r.resyncs, "resync of the moved tenant"); got != moved {
		t.Fatalf("resynced %s, want %s", got, moved)
	}
	f.publishAll(t, f.tenants, 1)
	none(t, f.r.resyncs, "resync of a tenant that did not move")
	none(t, f.r.lost, "Lost for a migration")
	m := redis.NewClient(&redis.Options{Addr: to})
	defer m.Close()
	n, err := m.PubSubShardNumSub(testContext(t), clusterNames.Channel(moved)).Result()
	if err != nil || n[clusterNames.Channel(moved)] != 1 {
		t.Fatalf("moved tenant on its new master: %v, %v; want 1 subscriber", n, err)
	}
	f.noCrossSlot(t)
}

// The last release unsubscribes after the linger, and a master connection
// with nothing left on it is closed; a new reference subscribes again.
func TestClusterBusLinger(t *testing.T) {
	f := newClusterFixture(t, 1)
	tenant := f.tenants[0]
	release := mustSubscribe(t, f.bus, tenant)
	release()
	ctx := testContext(t)
	testenv.Eventually(t, "unsubscribed after the linger", func() bool {
		return len(f.bus.Subscribed()) == 0 && len(f.bus.Shards()) == 0
	})
	m := redis.NewClient(&redis.Options{Addr: f.c.MasterOf(clusterNames.Channel(tenant))})
	defer m.Close()
	if n, err := m.PubSubShardNumSub(ctx, clusterNames.Channel(tenant)).Result(); err != nil || n[clusterNames.Channel(tenant)] != 0 {
		t.Fatalf("after the linger: %v subscribers, %v; want 0", n, err)
	}
	mustSubscribe(t, f.bus, tenant)
	f.publishAll(t, []string{tenant}, 1)
	if s := f.bus.Stats(); s.Subscribes != 2 || s.Unsubscribes != 1 {
		t.Fatalf("stats %+v: want 2 subscribes and 1 unsubscribe", s)
	}
}

// Subscribe fails cleanly when the bus is closed, and for an invalid
// tenant; Close ends every goroutine (the package's leak check).
func TestClusterBusSubscribeErrors(t *testing.T) {
	f := newClusterFixture(t, 1)
	if _, err := f.bus.Subscribe(context.Background(), "bad tenant"); err == nil {
		t.Fatal("subscribe of an invalid tenant succeeded")
	}
	mustSubscribe(t, f.bus, f.tenants[0])
	closeBus(t, f.bus)
	if _, err := f.bus.Subscribe(context.Background(), f.tenants[1]); err != ErrClosed {
		t.Fatalf("subscribe after close: %v, want ErrClosed", err)
	}
}

// proxyFirstMaster makes b dial the fixture's first master through a proxy
// the test can stall or cut, and returns it with that master's address.
func proxyFirstMaster(t *testing.T, f *clusterFixture, b *ClusterBus) (*testenv.Proxy, string) {
	victim := f.c.Masters()[0].Addr
	proxy := testenv.StartProxy(t, victim)
	b.dialShard = func(ctx context.Context, network, addr string) (net.Conn, error) {
		if addr == victim {
			addr = proxy.Addr
		}
		return (&net.Dialer{}).DialContext(ctx, network, addr)
	}
	return proxy, victim
}

// A shard whose connection goes half-open (nothing delivered, nothing
// answered) stops hearing its liveness messages: the bus replaces it within
// the liveness timeout, long before a ping would tell, reports the loss,
// resubscribes that master's tenants on a new connection and resyncs them.
func TestClusterBusLivenessReplacesASilentShard(t *testing.T) {
	var proxy *testenv.Proxy
	var victim string
	f := newClusterFixtureWith(t, 2, BusConfig{LivenessInterval: 100 * time.Millisecond, PingInterval: time.Minute},
		func(f *clusterFixture, b *ClusterBus) {
			proxy, victim = proxyFirstMaster(t, f, b)
		})
	for _, tenant := range f.tenants {
		mustSubscribe(t, f.bus, tenant)
	}
	f.publishAll(t, f.tenants, 1)
	orphans := slices.Clone(f.byOwner[victim])
	slices.Sort(orphans)

	proxy.Stall()
	if err := next(t, f.r.lost, "Lost after the shard went silent"); !errors.Is(err, errNoLiveness) {
		t.Fatalf("Lost(%v), want the liveness check's error", err)
	}
	next(t, f.r.restored, "Restored on a new connection")
	if got := resyncsOf(t, f.r, len(orphans)); !slices.Equal(got, orphans) {
		t.Fatalf("resynced %v, want the silent master's tenants %v", got, orphans)
	}
	f.publishAll(t, f.tenants, 2)
	if s := f.bus.Stats(); s.LivenessSent == 0 || s.LivenessHeard == 0 || s.Losses != 1 {
		t.Fatalf("stats %+v: want liveness messages sent and heard, and one loss", s)
	}
	f.noCrossSlot(t)
}
