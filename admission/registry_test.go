package admission

import (
	"context"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pushd/pushd/internal/testenv"
)

// tenantsInBuckets returns n tenant ids, each in a registry bucket of its
// own.
func tenantsInBuckets(t *testing.T, n int) []string {
	t.Helper()
	var out []string
	used := make(map[int]bool)
	for i := 0; len(out) < n; i++ {
		if i == 10000 {
			t.Fatalf("no %d tenants in distinct buckets", n)
		}
		id := "t" + strconv.Itoa(i)
		if b := tenantBucket(id); !used[b] {
			used[b] = true
			out = append(out, id)
		}
	}
	return out
}

// registered reads every registry bucket: tenant -> its bucket. A tenant
// found in a bucket other than its own fails the test.
func registered(t *testing.T, rdb redis.Cmdable, n names) map[string]int {
	t.Helper()
	ctx := context.Background()
	pipe := rdb.Pipeline()
	cmds := make([]*redis.StringSliceCmd, tenantBuckets)
	for b := range tenantBuckets {
		cmds[b] = pipe.SMembers(ctx, n.tenants(b))
	}
	if _, err := pipe.Exec(ctx); err != nil {
		t.Fatal(err)
	}
	out := make(map[string]int)
	for b, cmd := range cmds {
		for _, tenant := range cmd.Val() {
			if tenantBucket(tenant) != b {
				t.Fatalf("tenant %s in bucket %d, its bucket is %d", tenant, b, tenantBucket(tenant))
			}
			out[tenant] = b
		}
	}
	return out
}

// stoppedWithLeases connects users on a Controller of r's prefix for each
// tenant, registers them with a renewal unless register is false (a node of
// the release before, which registers elsewhere), and closes it without
// releasing them: a node that went away with its leases left in Redis.
func stoppedWithLeases(t *testing.T, r testenv.Redis, tenants []string, users []string, register bool) {
	t.Helper()
	c := newController(t, Config{Redis: r.Client, Prefix: r.Names.Prefix, Timeout: 2 * time.Second,
		MaxConnsPerUser: 10, LeaseTTL: time.Minute, RenewInterval: time.Hour, ReconcileInterval: time.Hour})
	ctx := context.Background()
	for _, tenant := range tenants {
		for _, u := range users {
			if _, d := c.Connect(ctx, tenant, u, "", ""); !d.Allowed || d.Local {
				t.Fatalf("%s/%s: %+v, want allowed by Redis", tenant, u, d)
			}
		}
	}
	if register {
		c.renew()
	}
	c.Close()
}

// reconciler is a Controller that only reconciles: it held no lease, so it
// knows tenants only from the registry.
func reconciler(t *testing.T, r testenv.Redis, interval time.Duration) *Controller {
	t.Helper()
	return newController(t, Config{Redis: r.Client, Prefix: r.Names.Prefix, Timeout: 2 * time.Second,
		MaxConnsPerUser: 10, RenewInterval: time.Hour, ReconcileInterval: interval})
}

func setCounts(t *testing.T, rdb *redis.Client, counts map[string]int) {
	t.Helper()
	for k, v := range counts {
		if err := rdb.Set(context.Background(), k, v, 0).Err(); err != nil {
			t.Fatal(err)
		}
	}
}

// Tenants in different buckets are registered each in its own, reconciled
// one bucket per step, and their expired leases purged and the tenants
// dropped from the registry, as with one registry set.
func TestReconcileAcrossBuckets(t *testing.T) {
	r := testenv.SharedRedis(t)
	ctx := context.Background()
	tenants := tenantsInBuckets(t, 3)
	stoppedWithLeases(t, r, tenants, []string{"u1", "u2"}, true)
	c := reconciler(t, r, time.Hour)
	n := c.names

	reg := registered(t, r.Client, n)
	if len(reg) != 3 {
		t.Fatalf("registered %v, want %v", reg, tenants)
	}
	for _, tenant := range tenants {
		setCounts(t, r.Client, map[string]int{n.capUser(tenant, "u1"): 5, n.capUser(tenant, "u2"): 0, n.capTenant(tenant): 9})
	}
	// One step reconciles its bucket's tenant only.
	// |5-1| + |0-1| + |9-2|
	diff, err := c.reconcileStep(ctx, reg[tenants[0]], false)
	if err != nil || diff != 12 {
		t.Fatalf("step of %s's bucket: repaired %d, %v; want 12", tenants[0], diff, err)
	}
	if got := count(t, r.Client, n.capTenant(tenants[0])); got != 2 {
		t.Fatalf("%s: tenant count %d after its step, want 2", tenants[0], got)
	}
	for _, tenant := range tenants[1:] {
		if got := count(t, r.Client, n.capTenant(tenant)); got != 9 {
			t.Fatalf("%s: tenant count %d after another bucket's step, want 9 untouched", tenant, got)
		}
	}
	diff, err = c.Reconcile(ctx)
	if err != nil || diff != 2*12 {
		t.Fatalf("reconcile: repaired %d, %v; want 24", diff, err)
	}
	for _, tenant := range tenants {
		if u1, u2, tn := count(t, r.Client, n.capUser(tenant, "u1")), count(t, r.Client, n.capUser(tenant, "u2")), count(t, r.Client, n.capTenant(tenant)); u1 != 1 || u2 != 1 || tn != 2 {
			t.Fatalf("%s after reconcile: u1 %d, u2 %d, tenant %d; want 1, 1, 2", tenant, u1, u2, tn)
		}
	}
	if len(registered(t, r.Client, n)) != 3 {
		t.Fatal("a tenant with live leases left the registry")
	}

	// The node stopped long ago: its leases expired (scores are expiry
	// times in Redis's clock, ms).
	for _, tenant := range tenants {
		for _, m := range r.Client.ZRange(ctx, n.leases(tenant), 0, -1).Val() {
			r.Client.ZAddXX(ctx, n.leases(tenant), redis.Z{Score: 1, Member: m})
		}
	}
	if _, err := c.Reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	if got := c.Stats().LeasesExpired; got != 6 {
		t.Fatalf("reconcile purged %d expired leases, want 6", got)
	}
	for _, tenant := range tenants {
		if u1, tn := count(t, r.Client, n.capUser(tenant, "u1")), count(t, r.Client, n.capTenant(tenant)); u1 != 0 || tn != 0 {
			t.Fatalf("%s after expiry: u1 %d, tenant %d; want 0", tenant, u1, tn)
		}
	}
	if reg := registered(t, r.Client, n); len(reg) != 0 {
		t.Fatalf("tenants without leases still registered: %v", reg)
	}
}

// A node of the release before registers its tenants in the one legacy
// set: the reconcile rebuilds their counts, moves those with live leases to
// their buckets and empties the legacy set.
func TestReconcileDrainsLegacyRegistry(t *testing.T) {
	r := testenv.SharedRedis(t)
	ctx := context.Background()
	tenants := tenantsInBuckets(t, 3)
	live, empty := tenants[:2], tenants[2]
	stoppedWithLeases(t, r, live, []string{"u1"}, false)
	c := reconciler(t, r, time.Hour)
	n := c.names
	if err := r.Client.SAdd(ctx, n.legacyTenants(), live[0], live[1], empty).Err(); err != nil {
		t.Fatal(err)
	}
	setCounts(t, r.Client, map[string]int{n.capUser(live[0], "u1"): 3, n.capTenant(live[1]): 0, n.capTenant(empty): 4})

	// The walk's last stop is the legacy set; the buckets know no tenant.
	diff, err := c.reconcileStep(ctx, reconcileSteps-1, false)
	if err != nil || diff != 2+1+4 {
		t.Fatalf("legacy step: repaired %d, %v; want %d", diff, err, 2+1+4)
	}
	for tenant, want := range map[string]int64{live[0]: 1, live[1]: 1, empty: 0} {
		if got := count(t, r.Client, n.capTenant(tenant)); got != want {
			t.Fatalf("%s: tenant count %d, want %d", tenant, got, want)
		}
	}
	if got := count(t, r.Client, n.capUser(live[0], "u1")); got != 1 {
		t.Fatalf("%s: u1's count %d, want 1", live[0], got)
	}
	if ex := r.Client.Exists(ctx, n.legacyTenants()).Val(); ex != 0 {
		t.Fatalf("legacy set left with %v", r.Client.SMembers(ctx, n.legacyTenants()).Val())
	}
	reg := registered(t, r.Client, n)
	if _, ok := reg[empty]; ok || len(reg) != 2 {
		t.Fatalf("registered %v, want %v", reg, live)
	}
	for _, tenant := range live {
		if b, ok := reg[tenant]; !ok || b != tenantBucket(tenant) {
			t.Fatalf("%s not moved to its bucket: %v", tenant, reg)
		}
	}
	// Moved, they are reconciled from their buckets from now on.
	setCounts(t, r.Client, map[string]int{n.capTenant(live[0]): 6, n.capTenant(live[1]): 6})
	if diff, err := c.Reconcile(ctx); err != nil || diff != 10 {
		t.Fatalf("reconcile of the moved tenants: %d, %v; want 10", diff, err)
	}
}

// Over many tenants the renewals' registrations go to exactly
// tenantBuckets keys, each holding the tenants that hash to it, and never
// to the legacy set.
func TestRegistrySpreadsOverBuckets(t *testing.T) {
	r := testenv.SharedRedis(t)
	ctx := context.Background()
	const many = 1000
	tenants := make([]string, many)
	for i := range tenants {
		tenants[i] = "tenant-" + strconv.Itoa(i)
	}
	stoppedWithLeases(t, r, tenants, []string{"u"}, true)
	n := names{prefix: r.Names.Prefix}

	var keys []string
	iter := r.Client.Scan(ctx, 0, n.legacyTenants()+"*", 1000).Iterator()
	for iter.Next(ctx) {
		keys = append(keys, iter.Val())
	}
	if err := iter.Err(); err != nil {
		t.Fatal(err)
	}
	slices.Sort(keys)
	want := make([]string, tenantBuckets)
	for b := range want {
		want[b] = n.tenants(b)
	}
	slices.Sort(want)
	if !slices.Equal(keys, want) {
		t.Fatalf("%d registry keys %v, want the %d buckets", len(keys), keys, tenantBuckets)
	}
	reg := registered(t, r.Client, n) // fails on a tenant in another's bucket
	if len(reg) != many {
		t.Fatalf("%d tenants registered, want %d", len(reg), many)
	}
}

// The Controller's goroutine walks every bucket and the legacy set within
// about one ReconcileInterval, one step at a time.
func TestReconcileWalkCoversEveryBucket(t *testing.T) {
	r := testenv.SharedRedis(t)
	ctx := context.Background()
	tenants := tenantsInBuckets(t, 4)
	stoppedWithLeases(t, r, tenants[:3], []string{"u1"}, true)
	stoppedWithLeases(t, r, tenants[3:], []string{"u1"}, false)
	n := names{prefix: r.Names.Prefix}
	if err := r.Client.SAdd(ctx, n.legacyTenants(), tenants[3]).Err(); err != nil {
		t.Fatal(err)
	}
	for _, tenant := range tenants {
		setCounts(t, r.Client, map[string]int{n.capTenant(tenant): 5})
	}
	c := reconciler(t, r, time.Duration(reconcileSteps)*10*time.Millisecond)
	if c.reconcileEvery() != 10*time.Millisecond {
		t.Fatalf("step every %s, want 10ms", c.reconcileEvery())
	}
	testenv.Eventually(t, "every tenant's count repaired and the legacy set drained", func() bool {
		for _, tenant := range tenants {
			if count(t, r.Client, n.capTenant(tenant)) != 1 {
				return false
			}
		}
		return r.Client.Exists(ctx, n.legacyTenants()).Val() == 0 && c.Stats().ReconcileDiff >= 4*4
	})
	// |5-1| per tenant, once: later steps find nothing to repair.
	if got := c.Stats().ReconcileDiff; got != 4*4 {
		t.Fatalf("repaired %d, want 16", got)
	}
}

// A bucket's step that fails keeps the users seen in its tenants for the
// next one: a count of a user left without a lease, which no registry or
// lease names, is still repaired after Redis comes back.
func TestFailedStepKeepsUsersSeen(t *testing.T) {
	rs := testenv.StartRedis(t)
	rdb := redis.NewClient(&redis.Options{Addr: rs.Addr, ContextTimeoutEnabled: true, DialerRetries: 1, MaxRetries: 1})
	t.Cleanup(func() { rdb.Close() })
	c := newController(t, Config{Redis: rdb, MaxConnsPerUser: 4, Timeout: 2 * time.Second,
		RenewInterval: time.Hour, ReconcileInterval: time.Hour})
	ctx := context.Background()
	h, d := c.Connect(ctx, "t1", "u1", "", "")
	if !d.Allowed || d.Local {
		t.Fatalf("connect: %+v", d)
	}
	h.Release()
	testenv.Eventually(t, "released in Redis", func() bool { return c.Stats().LeasesReleased == 1 })

	rs.Stop()
	sctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	_, err := c.reconcileStep(sctx, tenantBucket("t1"), false)
	cancel()
	if err == nil {
		t.Fatal("step succeeded with Redis stopped")
	}
	rs.Start() // empty: it keeps nothing on disk
	if err := rdb.Set(ctx, c.names.capUser("t1", "u1"), 3, 0).Err(); err != nil {
		t.Fatal(err)
	}
	diff, err := c.reconcileStep(ctx, tenantBucket("t1"), false)
	if err != nil || diff != 3 {
		t.Fatalf("step after Redis came back: repaired %d, %v; want 3 (u1's count)", diff, err)
	}
	if got := count(t, rdb, c.names.capUser("t1", "u1")); got != 0 {
		t.Fatalf("u1's count %d, want 0", got)
	}
}

// Every node's walk visits every registered tenant each ReconcileInterval,
// and one node of the fleet reconciles it: three nodes' steps over the
// tenant's bucket run its reconcile once. A user whose last lease a node
// released is checked by whichever node reconciles next, through the
// tenant's shared set: its count, left wrong, is repaired there.
func TestWalkReconcilesATenantOnceForTheFleet(t *testing.T) {
	r := testenv.SharedRedis(t)
	ctx := context.Background()
	tenant := testenv.UniqueID("t")
	stoppedWithLeases(t, r, []string{tenant}, []string{"u1", "u2"}, true)
	b := reconciler(t, r, time.Hour)
	h, d := b.Connect(ctx, tenant, "u3", "", "")
	if !d.Allowed || d.Local {
		t.Fatalf("connect: %+v", d)
	}
	h.Release()
	testenv.Eventually(t, "released in Redis", func() bool { return b.Stats().LeasesReleased == 1 })
	n := b.names
	setCounts(t, r.Client, map[string]int{n.capUser(tenant, "u3"): 2})

	a, c := reconciler(t, r, time.Hour), reconciler(t, r, time.Hour)
	nodes := []*Controller{a, b, c}
	walk := func() (runs int64) {
		t.Helper()
		for _, node := range nodes {
			if _, err := node.reconcileStep(ctx, tenantBucket(tenant), true); err != nil {
				t.Fatal(err)
			}
		}
		for _, node := range nodes {
			runs += node.Stats().Reconciles
		}
		return runs
	}
	if runs := walk(); runs != 1 {
		t.Fatalf("three nodes' walks reconciled the tenant %d times, want once", runs)
	}
	if got := count(t, r.Client, n.capUser(tenant, "u3")); got != 2 {
		t.Fatalf("u3's count %d before a reconcile knew of u3, want 2 still", got)
	}
	// The next interval: the claim has expired.
	if err := r.Client.Del(ctx, n.reconciled(tenant)).Err(); err != nil {
		t.Fatal(err)
	}
	if runs := walk(); runs != 2 {
		t.Fatalf("after two intervals the tenant was reconciled %d times, want twice", runs)
	}
	if u1, u3, tn := count(t, r.Client, n.capUser(tenant, "u1")), count(t, r.Client, n.capUser(tenant, "u3")), count(t, r.Client, n.capTenant(tenant)); u1 != 1 || u3 != 0 || tn != 2 {
		t.Fatalf("counts u1 %d, u3 %d, tenant %d; want 1, 0 (u3 holds no lease), 2", u1, u3, tn)
	}
	if left := r.Client.SCard(ctx, n.seenUsers(tenant)).Val(); left != 0 {
		t.Fatalf("%d users left in the shared set after their reconcile", left)
	}
}
