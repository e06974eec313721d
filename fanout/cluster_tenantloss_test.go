package fanout

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/pushd/pushd/internal/testenv"
)

// tenantRecorder is a recorder that hears losses per tenant: its events
// get "tlost:<tenants, comma-separated>" and "trestored:<tenant>" too, in
// the order of the calls.
type tenantRecorder struct {
	*recorder
	tlost chan tenantsLost
}

type tenantsLost struct {
	tenants []string // sorted
	err     error
}

func newTenantRecorder(t *testing.T) *tenantRecorder {
	return &tenantRecorder{recorder: newRecorder(t), tlost: make(chan tenantsLost, 64)}
}

var _ TenantLossHandler = (*tenantRecorder)(nil)

func (r *tenantRecorder) TenantsLost(tenants []string, err error) {
	put(r.recorder, r.tlost, tenantsLost{slices.Sorted(slices.Values(tenants)), err})
	put(r.recorder, r.events, "tlost:"+strings.Join(tenants, ","))
}

func (r *tenantRecorder) TenantsRestored(tenants []string) {
	for _, tenant := range tenants {
		put(r.recorder, r.events, "trestored:"+tenant)
	}
}

// restoredThenResynced reads events until every tenant of want was
// restored, and fails unless each restore is followed at once by that
// tenant's Resync (resync) or by none (!resync), or if anything else comes.
func restoredThenResynced(t *testing.T, r *tenantRecorder, want []string, resync bool) {
	t.Helper()
	left := slices.Clone(want)
	for len(left) > 0 {
		ev := next(t, r.events, "restore of "+strings.Join(left, ","))
		tenant, ok := strings.CutPrefix(ev, "trestored:")
		i := slices.Index(left, tenant)
		if !ok || i < 0 {
			t.Fatalf("event %q, want the restore of one of %v", ev, left)
		}
		left = slices.Delete(left, i, i+1)
		if resync {
			if ev := next(t, r.events, "resync of "+tenant); ev != "resync:"+tenant {
				t.Fatalf("after the restore of %s: %q, want its resync", tenant, ev)
			}
		}
	}
}

// A master dies: with a per-tenant handler the bus reports the loss of that
// master's tenants only (TenantsLost, no Lost), the other tenants'
// notifications keep coming, and after the failover each lost tenant is
// restored and resynced, nothing else; publishes reach everyone after.
func TestClusterBusShardLossIsPerTenant(t *testing.T) {
	r := newTenantRecorder(t)
	f := newClusterFixtureWith(t, 2, BusConfig{}, func(f *clusterFixture, _ *ClusterBus) { f.r, f.handler = r.recorder, r })
	for _, tenant := range f.tenants {
		mustSubscribe(t, f.bus, tenant)
	}
	f.publishAll(t, f.tenants, 1)

	f.c.WaitReplicated()
	victim := f.c.Masters()[0]
	orphans := slices.Sorted(slices.Values(f.byOwner[victim.Addr]))
	var survivors []string
	for _, tenant := range f.tenants {
		if !slices.Contains(orphans, tenant) {
			survivors = append(survivors, tenant)
		}
	}
	victim.Stop()

	if got := next(t, r.tlost, "TenantsLost after the master died"); !slices.Equal(got.tenants, orphans) || got.err == nil {
		t.Fatalf("TenantsLost(%v, %v), want the dead master's tenants %v and an error", got.tenants, got.err, orphans)
	}
	if ev := next(t, r.events, "the loss's event"); !strings.HasPrefix(ev, "tlost:") {
		t.Fatalf("first event %q, want the TenantsLost", ev)
	}
	f.publishAll(t, survivors, 2) // their shards are untouched
	restoredThenResynced(t, r, orphans, true)
	f.c.WaitOK()
	f.publishAll(t, f.tenants, 3)
	none(t, r.events, "event after the orphans' restores")
	none(t, r.lost, "Lost of the whole bus")
	none(t, r.restored, "Restored of the whole bus")
	if s := f.bus.Stats(); s.Losses != 1 || s.Resyncs != int64(len(orphans)) {
		t.Fatalf("stats %+v: want 1 loss and %d resyncs", s, len(orphans))
	}
	f.noCrossSlot(t)
}

// A lost tenant whose last reference is released while its shard is still
// down (new connections to it stall) lingers out: the bus ends its loss
// with TenantsRestored and no Resync; the other lost tenant is restored and
// resynced once the shard answers again.
func TestClusterBusLostTenantLingersOut(t *testing.T) {
	r := newTenantRecorder(t)
	var proxy *testenv.Proxy
	var victim string
	f := newClusterFixtureWith(t, 2, BusConfig{LivenessInterval: 100 * time.Millisecond, PingInterval: time.Minute},
		func(f *clusterFixture, b *ClusterBus) {
			f.r, f.handler = r.recorder, r
			proxy, victim = proxyFirstMaster(t, f, b)
		})
	releases := map[string]func(){}
	for _, tenant := range f.tenants {
		releases[tenant] = mustSubscribe(t, f.bus, tenant)
	}
	f.publishAll(t, f.tenants, 1)
	orphans := slices.Sorted(slices.Values(f.byOwner[victim]))

	proxy.StallAll()
	if got := next(t, r.tlost, "TenantsLost after the shard went silent"); !slices.Equal(got.tenants, orphans) || !errors.Is(got.err, errNoLiveness) {
		t.Fatalf("TenantsLost(%v, %v), want the silent master's tenants %v and the liveness check's error", got.tenants, got.err, orphans)
	}
	if ev := next(t, r.events, "the loss's event"); !strings.HasPrefix(ev, "tlost:") {
		t.Fatalf("first event %q, want the TenantsLost", ev)
	}
	gone, kept := orphans[0], orphans[1:]
	releases[gone]()
	if ev := next(t, r.events, "the released tenant's restore"); ev != "trestored:"+gone {
		t.Fatalf("event %q, want trestored:%s (its linger ran out)", ev, gone)
	}
	proxy.Pass()
	restoredThenResynced(t, r, kept, true)
	f.publishAll(t, slices.DeleteFunc(slices.Clone(f.tenants), func(s string) bool { return s == gone }), 2)
	none(t, r.events, "event after the restores")
	none(t, r.lost, "Lost of the whole bus")
}
