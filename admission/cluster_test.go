package admission

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pushd/pushd/auth/session"
	"github.com/pushd/pushd/internal/testenv"
)

// TestAdmissionOnRedisCluster is the cluster test of record for admission:
// on a Redis Cluster of three masters, with tenants, users, client IPs and
// sessions whose keys land on every master, the paths a node takes (connect
// buckets, plan windows, fleet caps with their leases acquired, renewed,
// released, purged and reconciled, the registry of tenants spread over
// buckets on every master and the legacy set drained, session
// re-validation) decide as they do
// on one Redis, and no command or script of theirs ever spans two slots:
// no node counts a CROSSSLOT error, no call failed, and every script touched
// only keys it was given in KEYS.
func TestAdmissionOnRedisCluster(t *testing.T) {
	e := startClusterEnv(t)
	declaredKeysOnly(t)

	t.Run("connect buckets", e.connectBuckets)
	t.Run("plan windows", e.planWindows)
	t.Run("fleet caps", e.fleetCaps)
	t.Run("leases of a stopped node", e.stoppedNode)
	t.Run("registry buckets", e.registryBuckets)
	t.Run("script cache lost on one master", e.scriptCacheLost)
	t.Run("sessions", e.sessions)

	e.checkNoErrors(t)
}

// clusterEnv is the cluster the subtests share, and what they leave to
// check at the end.
type clusterEnv struct {
	rc      *testenv.RedisCluster
	cl      *redis.ClusterClient
	masters []string                 // addresses of the masters
	direct  map[string]*redis.Client // a plain client per node address
	// tenants are one tenant per master (tenants[i]'s hash tag is served by
	// masters[i]).
	tenants []string

	mu    sync.Mutex    // guards nodes
	nodes []*Controller // every Controller made, to check its counters
	logs  *logRecorder
}

func startClusterEnv(t *testing.T) *clusterEnv {
	t.Helper()
	rc := testenv.StartRedisCluster(t, 3)
	e := &clusterEnv{rc: rc, cl: rc.Client(), direct: make(map[string]*redis.Client), logs: &logRecorder{}}
	ctx := context.Background()
	for _, s := range rc.Nodes {
		c := redis.NewClient(&redis.Options{Addr: s.Addr})
		t.Cleanup(func() { c.Close() })
		e.direct[s.Addr] = c
	}
	for _, m := range rc.Masters() {
		e.masters = append(e.masters, m.Addr)
	}
	if len(e.masters) != 3 {
		t.Fatalf("%d masters, want 3", len(e.masters))
	}
	if err := e.cl.Ping(ctx).Err(); err != nil { // loads the slot map
		t.Fatal(err)
	}
	// From here on, every error a node counts is the test's.
	for addr, c := range e.direct {
		if err := c.ConfigResetStat(ctx).Err(); err != nil {
			t.Fatalf("%s: CONFIG RESETSTAT: %v", addr, err)
		}
	}
	e.tenants = e.perMaster(t, func(i int) string { return "tenant" + strconv.Itoa(i) },
		func(tenant string) string { return names{}.capTenant(tenant) })
	return e
}

// master returns the address of the master serving key's slot.
func (e *clusterEnv) master(t *testing.T, key string) string {
	t.Helper()
	m, err := e.cl.MasterForKey(context.Background(), key)
	if err != nil {
		t.Fatalf("master for %s: %v", key, err)
	}
	return m.Options().Addr
}

// perMaster returns one of name(0), name(1), ... per master, in the order
// of e.masters: the first whose key(name) that master serves.
func (e *clusterEnv) perMaster(t *testing.T, name func(int) string, key func(string) string) []string {
	t.Helper()
	out := make([]string, len(e.masters))
	left := len(e.masters)
	for i := 0; left > 0; i++ {
		if i == 10000 {
			t.Fatal("no name for every master in 10000 tries")
		}
		n := name(i)
		addr := e.master(t, key(n))
		for j, m := range e.masters {
			if m == addr && out[j] == "" {
				out[j] = n
				left--
			}
		}
	}
	return out
}

// node starts a Controller on the cluster: one pushd node.
func (e *clusterEnv) node(t *testing.T, prefix string, cfg Config) *Controller {
	t.Helper()
	cfg.Redis, cfg.Prefix, cfg.Logger = e.cl, prefix, slog.New(e.logs)
	cfg.Timeout = 2 * time.Second // a cluster under -race on a busy machine; no fallback wanted
	// The goroutine's own timers stay out of the way: the test runs
	// renewals, reconciles and session checks itself.
	cfg.RenewInterval, cfg.ReconcileInterval, cfg.SessionCheckInterval = time.Hour, time.Hour, time.Hour
	c := New(cfg)
	t.Cleanup(c.Close)
	e.mu.Lock()
	e.nodes = append(e.nodes, c)
	e.mu.Unlock()
	return c
}

// count reads an integer key, 0 when it is missing.
func (e *clusterEnv) count(t *testing.T, key string) int64 {
	t.Helper()
	v, err := e.cl.Get(context.Background(), key).Int64()
	if err != nil && err != redis.Nil {
		t.Fatalf("GET %s: %v", key, err)
	}
	return v
}

func mustDecide(t *testing.T, what string, d Decision, allowed bool, rule string) {
	t.Helper()
	if d.Local {
		t.Fatalf("%s: decided on local limits (%+v): Redis failed", what, d)
	}
	if d.Allowed != allowed || d.Rule != rule {
		t.Fatalf("%s: %+v, want allowed %v by rule %q", what, d, allowed, rule)
	}
}

// connectBuckets: each user's bucket and each client IP's, in one
// pipeline whose two scripts run on different masters.
func (e *clusterEnv) connectBuckets(t *testing.T) {
	c := e.node(t, "b:", Config{ConnectUserBurst: 2, ConnectUserRate: 0.001, ConnectIPBurst: 4, ConnectIPRate: 0.001})
	ctx := context.Background()
	for i, tenant := range e.tenants {
		users := e.perMaster(t, func(j int) string { return "u" + strconv.Itoa(j) }, func(u string) string { return c.names.connUser(tenant, u) })
		ips := e.perMaster(t, func(j int) string { return fmt.Sprintf("10.%d.0.%d", i, j) }, func(ip string) string { return c.names.connIP(ip) })
		u, other, third, ip := users[i], users[(i+1)%3], users[(i+2)%3], ips[(i+1)%3]
		if e.master(t, c.names.connUser(tenant, u)) == e.master(t, c.names.connIP(ip)) {
			t.Fatal("the user's and the IP's buckets on one master")
		}
		for n := range 2 {
			h, d := c.Connect(ctx, tenant, u, ip, "")
			mustDecide(t, fmt.Sprintf("%s/%s connect %d", tenant, u, n), d, true, "")
			h.Release()
		}
		_, d := c.Connect(ctx, tenant, u, ip, "")
		mustDecide(t, tenant+"/"+u+" 3rd connect", d, false, RuleConnectUser)
		if d.RetryAfter <= 0 {
			t.Fatalf("retry after %s", d.RetryAfter)
		}
		// Both buckets are taken in one round trip, so the refused connect
		// took the IP's third token all the same: one is left.
		_, d = c.Connect(ctx, tenant, other, ip, "")
		mustDecide(t, "another user from the IP", d, true, "")
		_, d = c.Connect(ctx, tenant, third, ip, "")
		mustDecide(t, "4th connect from the IP", d, false, RuleConnectIP)
		_, d = c.Connect(ctx, tenant, third, ips[i], "")
		mustDecide(t, "another IP", d, true, "")
	}
}

// planWindows: a tenant's API window per endpoint, its plan read from its
// configuration or its token's claim.
func (e *clusterEnv) planWindows(t *testing.T) {
	c := e.node(t, "w:", Config{Plans: map[string]int{PlanFree: 3, PlanPro: 5}, APIWindow: time.Hour})
	ctx := context.Background()
	if err := e.cl.HSet(ctx, c.names.tenantConfig(e.tenants[1]), "plan", PlanPro).Err(); err != nil {
		t.Fatal(err)
	}
	for i, tenant := range e.tenants {
		claim, limit := "", 3
		switch i {
		case 1:
			limit = 5 // configured
		case 2:
			claim, limit = PlanPro, 5
		}
		for n := range limit {
			mustDecide(t, fmt.Sprintf("%s call %d", tenant, n), c.API(ctx, tenant, claim, "task"), true, "")
		}
		d := c.API(ctx, tenant, claim, "task")
		mustDecide(t, tenant+" call over the plan", d, false, RuleAPI)
		if d.RetryAfter <= 0 || d.RetryAfter > time.Hour+time.Millisecond {
			t.Fatalf("retry after %s, want within the window", d.RetryAfter)
		}
		mustDecide(t, tenant+" another endpoint", c.API(ctx, tenant, claim, "tasks"), true, "")
	}
}

// fleetCaps: two nodes share each tenant's caps; renewals write back what
// Redis lost, the reconcile repairs counts, and a release frees a slot.
func (e *clusterEnv) fleetCaps(t *testing.T) {
	cfg := Config{MaxConnsPerUser: 2, MaxConnsPerTenant: 3, LeaseTTL: time.Minute}
	a, b := e.node(t, "c:", cfg), e.node(t, "c:", cfg)
	n := a.names
	ctx := context.Background()
	aHolds := make(map[string]*Hold)
	for _, tenant := range e.tenants {
		h, d := a.Connect(ctx, tenant, "u1", "", "")
		mustDecide(t, tenant+" u1 on a", d, true, "")
		aHolds[tenant] = h
		_, d = b.Connect(ctx, tenant, "u1", "", "")
		mustDecide(t, tenant+" u1 on b", d, true, "")
		_, d = a.Connect(ctx, tenant, "u1", "", "")
		mustDecide(t, tenant+" u1's 3rd, fleet-wide", d, false, RuleUserCap)
		_, d = b.Connect(ctx, tenant, "u2", "", "")
		mustDecide(t, tenant+" u2 on b", d, true, "")
		_, d = a.Connect(ctx, tenant, "u3", "", "")
		mustDecide(t, tenant+" 4th of the tenant", d, false, RuleTenantCap)
		e.wantCounts(t, n, tenant, map[string]int64{"u1": 2, "u2": 1, "u3": 0}, 3)
	}

	// Renewals register the tenants for the reconcile, and write back the
	// leases and counts of tenants whose master lost them.
	a.renew()
	b.renew()
	if reg := registered(t, e.cl, n); len(reg) != len(e.tenants) {
		t.Fatalf("registered tenants %v, want %v", reg, e.tenants)
	}
	for _, tenant := range e.tenants {
		for _, k := range []string{n.leases(tenant), n.capTenant(tenant), n.capUser(tenant, "u1"), n.capUser(tenant, "u2")} {
			if err := e.cl.Del(ctx, k).Err(); err != nil {
				t.Fatal(err)
			}
		}
	}
	a.renew()
	b.renew()
	if got := a.Stats().LeasesReadded + b.Stats().LeasesReadded; got != 9 {
		t.Fatalf("re-added %d leases, want 9 (3 per tenant)", got)
	}
	for _, tenant := range e.tenants {
		e.wantCounts(t, n, tenant, map[string]int64{"u1": 2, "u2": 1}, 3)
	}

	// The reconcile rebuilds wrong counts from the leases, those of users
	// another node holds included.
	for _, tenant := range e.tenants {
		for k, v := range map[string]int{n.capUser(tenant, "u1"): 7, n.capUser(tenant, "u2"): 5, n.capTenant(tenant): 1} {
			if err := e.cl.Set(ctx, k, v, 0).Err(); err != nil {
				t.Fatal(err)
			}
		}
	}
	diff, err := a.Reconcile(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if diff != 3*(5+4+2) {
		t.Fatalf("reconcile repaired %d, want %d", diff, 3*(5+4+2))
	}
	for _, tenant := range e.tenants {
		e.wantCounts(t, n, tenant, map[string]int64{"u1": 2, "u2": 1}, 3)
	}
	if diff, err := a.Reconcile(ctx); diff != 0 || err != nil {
		t.Fatalf("second reconcile: %d, %v", diff, err)
	}

	// Node a's connections close, then a goes away: Close releases their
	// leases in Redis before it returns.
	for _, h := range aHolds {
		h.Release()
	}
	a.Close()
	if got := a.Stats().LeasesReleased; got != 3 {
		t.Fatalf("released %d, want 3", got)
	}
	for _, tenant := range e.tenants {
		e.wantCounts(t, n, tenant, map[string]int64{"u1": 1, "u2": 1}, 2)
		_, d := b.Connect(ctx, tenant, "u1", "", "")
		mustDecide(t, tenant+" u1 after a release", d, true, "")
		_, d = b.Connect(ctx, tenant, "u1", "", "")
		mustDecide(t, tenant+" u1 over the cap again", d, false, RuleUserCap)
	}
}

// wantCounts checks a tenant's user and tenant counts and its leases.
func (e *clusterEnv) wantCounts(t *testing.T, n names, tenant string, users map[string]int64, total int64) {
	t.Helper()
	for u, want := range users {
		if got := e.count(t, n.capUser(tenant, u)); got != want {
			t.Fatalf("%s: %s's count %d, want %d", tenant, u, got, want)
		}
	}
	if got := e.count(t, n.capTenant(tenant)); got != total {
		t.Fatalf("%s: tenant count %d, want %d", tenant, got, total)
	}
	if got, err := e.cl.ZCard(context.Background(), n.leases(tenant)).Result(); err != nil || got != total {
		t.Fatalf("%s: %d leases (%v), want %d", tenant, got, err, total)
	}
}

// stoppedNode: the leases of a node that stopped renewing them give their
// slots back to the next acquire, its own user's at once and other users'
// in a purge that names their count keys.
func (e *clusterEnv) stoppedNode(t *testing.T) {
	ctx := context.Background()
	dead := e.node(t, "s:", Config{MaxConnsPerUser: 5, LeaseTTL: time.Minute})
	n := dead.names
	for _, tenant := range e.tenants {
		for _, u := range []string{"ux", "uy"} {
			_, d := dead.Connect(ctx, tenant, u, "", "")
			mustDecide(t, tenant+" "+u+" on the node that stops", d, true, "")
		}
	}
	dead.Close()
	// The node stopped long ago: its leases expired (scores are expiry
	// times in Redis's clock, ms).
	for _, tenant := range e.tenants {
		members, err := e.cl.ZRange(ctx, n.leases(tenant), 0, -1).Result()
		if err != nil || len(members) != 2 {
			t.Fatalf("%s: leases %v, %v", tenant, members, err)
		}
		for _, m := range members {
			if err := e.cl.ZAddXX(ctx, n.leases(tenant), redis.Z{Score: 1, Member: m}).Err(); err != nil {
				t.Fatal(err)
			}
		}
	}
	live := e.node(t, "s:", Config{MaxConnsPerUser: 1, MaxConnsPerTenant: 2, LeaseTTL: time.Minute})
	for _, tenant := range e.tenants {
		_, d := live.Connect(ctx, tenant, "ux", "", "")
		mustDecide(t, tenant+" ux, its expired lease purged", d, true, "")
		_, d = live.Connect(ctx, tenant, "uz", "", "")
		mustDecide(t, tenant+" uz, uy's expired lease not counted", d, true, "")
		_, d = live.Connect(ctx, tenant, "uw", "", "")
		mustDecide(t, tenant+" uw over the tenant cap", d, false, RuleTenantCap)
	}
	live.Close() // purges what its acquires left before it returns
	if got := live.Stats().LeasesExpired; got != 6 {
		t.Fatalf("purged %d expired leases, want 6 (ux's and uy's in each tenant)", got)
	}
	for _, tenant := range e.tenants {
		e.wantCounts(t, n, tenant, map[string]int64{"ux": 1, "uy": 0, "uz": 1}, 2)
	}
}

// registryBuckets: the tenants a renewal registers go to their buckets,
// here one on each master, one SADD per bucket; the reconcile rebuilds
// their counts and those of the legacy set, which it drains, and drops the
// tenants whose leases all expired.
func (e *clusterEnv) registryBuckets(t *testing.T) {
	ctx := context.Background()
	cfg := Config{MaxConnsPerUser: 5, LeaseTTL: time.Minute}
	dead, old := e.node(t, "r:", cfg), e.node(t, "r:", cfg)
	n := dead.names
	tenants := e.perMaster(t, func(i int) string { return "rt" + strconv.Itoa(i) },
		func(tenant string) string { return n.tenants(tenantBucket(tenant)) })
	for _, tenant := range tenants {
		_, d := dead.Connect(ctx, tenant, "u1", "", "")
		mustDecide(t, tenant+" u1", d, true, "")
	}
	before := make(map[string]int)
	for _, m := range e.masters {
		before[m] = e.commandStats(t, m)["sadd"].calls
	}
	dead.renew()
	for _, m := range e.masters {
		if got := e.commandStats(t, m)["sadd"].calls - before[m]; got != 1 {
			t.Fatalf("%s: %d SADDs from one renewal, want 1 (one bucket per master)", m, got)
		}
	}
	dead.Close() // its leases stay in Redis
	// A node of the release before registered its tenant in the legacy
	// set, with a tenant whose leases are gone and whose count is stale.
	oldTenant, emptyTenant := "rold", "rempty"
	_, d := old.Connect(ctx, oldTenant, "u1", "", "")
	mustDecide(t, "the old node's tenant", d, true, "")
	old.Close()
	if err := e.cl.SAdd(ctx, n.legacyTenants(), oldTenant, emptyTenant).Err(); err != nil {
		t.Fatal(err)
	}
	stale := map[string]int{n.capTenant(emptyTenant): 3, n.capTenant(oldTenant): 4}
	for _, tenant := range tenants {
		stale[n.capTenant(tenant)] = 6
	}
	for k, v := range stale {
		if err := e.cl.Set(ctx, k, v, 0).Err(); err != nil {
			t.Fatal(err)
		}
	}

	r := e.node(t, "r:", cfg)
	diff, err := r.Reconcile(ctx)
	// |3-0| + |4-1|, and |6-1| per tenant
	if want := int64(3 + 3 + 5*len(tenants)); err != nil || diff != want {
		t.Fatalf("reconcile repaired %d, %v; want %d", diff, err, want)
	}
	for _, tenant := range append([]string{oldTenant, emptyTenant}, tenants...) {
		want := int64(1)
		if tenant == emptyTenant {
			want = 0
		}
		e.wantCounts(t, n, tenant, map[string]int64{"u1": want}, want)
	}
	if ex := e.cl.Exists(ctx, n.legacyTenants()).Val(); ex != 0 {
		t.Fatalf("legacy set not drained: %v", e.cl.SMembers(ctx, n.legacyTenants()).Val())
	}
	reg := registered(t, e.cl, n)
	if _, ok := reg[oldTenant]; !ok || len(reg) != len(tenants)+1 {
		t.Fatalf("registered %v, want %v and %s", reg, tenants, oldTenant)
	}

	// Every lease expires: the reconcile purges them and empties the
	// registry.
	for tenant := range reg {
		for _, m := range e.cl.ZRange(ctx, n.leases(tenant), 0, -1).Val() {
			if err := e.cl.ZAddXX(ctx, n.leases(tenant), redis.Z{Score: 1, Member: m}).Err(); err != nil {
				t.Fatal(err)
			}
		}
	}
	if _, err := r.Reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	if got, want := r.Stats().LeasesExpired, int64(len(reg)); got != want {
		t.Fatalf("purged %d expired leases, want %d", got, want)
	}
	for tenant := range reg {
		e.wantCounts(t, n, tenant, map[string]int64{"u1": 0}, 0)
	}
	if reg := registered(t, e.cl, n); len(reg) != 0 {
		t.Fatalf("tenants without leases still registered: %v", reg)
	}
}

// scriptCacheLost: a master that lost its scripts (a restart, or a replica
// promoted since they were loaded) answers NOSCRIPT while the others run
// the same pipeline's calls: only its calls run again, so one connect
// takes one token from each bucket.
func (e *clusterEnv) scriptCacheLost(t *testing.T) {
	ctx := context.Background()
	c := e.node(t, "n:", Config{ConnectUserBurst: 3, ConnectUserRate: 0.001, ConnectIPBurst: 3, ConnectIPRate: 0.001})
	tenant := e.tenants[0]
	users := e.perMaster(t, func(j int) string { return "u" + strconv.Itoa(j) }, func(u string) string { return c.names.connUser(tenant, u) })
	ips := e.perMaster(t, func(j int) string { return "10.9.0." + strconv.Itoa(j) }, func(ip string) string { return c.names.connIP(ip) })
	user, ip, lost := users[1], ips[0], e.masters[1]
	for _, m := range e.masters {
		if err := bucketScript.Load(ctx, e.direct[m]).Err(); err != nil {
			t.Fatal(err)
		}
	}
	if err := e.direct[lost].ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	before := e.noScripts(t, lost)
	_, d := c.Connect(ctx, tenant, user, ip, "")
	mustDecide(t, "connect with the user's bucket on the master without scripts", d, true, "")
	if e.noScripts(t, lost) == before {
		t.Fatal("the master without scripts answered no NOSCRIPT: nothing was tested")
	}
	for _, k := range []string{c.names.connIP(ip), c.names.connUser(tenant, user)} {
		tokens, err := e.cl.HGet(ctx, k, "tokens").Float64()
		if err != nil {
			t.Fatal(err)
		}
		if tokens < 2 || tokens >= 2.5 {
			t.Fatalf("%s: %.3f tokens left after one connect, want 2", k, tokens)
		}
	}
}

// noScripts is how many NOSCRIPT errors node addr answered.
func (e *clusterEnv) noScripts(t *testing.T, addr string) int {
	t.Helper()
	return e.errorStats(t, addr)["NOSCRIPT"]
}

// sessions: the sessions of open connections are re-validated through
// session.Store on the cluster, and the one deleted is revoked.
func (e *clusterEnv) sessions(t *testing.T) {
	ctx := context.Background()
	const prefix = "x:"
	sessions := session.New(session.Config{Redis: e.cl, Prefix: prefix})
	c := e.node(t, prefix, Config{MaxConnsPerUser: 10, Sessions: sessions})
	tokens := e.perMaster(t, func(int) string { return "s_" + testenv.RandomSuffix(12) }, func(tok string) string { return prefix + "session:" + tok })
	holds := make([]*Hold, len(tokens))
	for i, tok := range tokens {
		tenant := e.tenants[i]
		if err := e.cl.Set(ctx, prefix+"session:"+tok, `{"tenant_id":"`+tenant+`","user_id":"u1"}`, time.Hour).Err(); err != nil {
			t.Fatal(err)
		}
		p, err := sessions.Resolve(ctx, tok)
		if err != nil || p.TenantID != tenant || p.UserID != "u1" {
			t.Fatalf("resolve %s: %+v, %v", tok, p, err)
		}
		h, d := c.Connect(ctx, p.TenantID, p.UserID, "", tok)
		mustDecide(t, "connect with a session", d, true, "")
		holds[i] = h
	}
	if err := e.cl.Del(ctx, prefix+"session:"+tokens[1]).Err(); err != nil {
		t.Fatal(err)
	}
	c.checkSessions()
	for i, h := range holds {
		if h.Revoked() != (i == 1) {
			t.Fatalf("session %d revoked %v", i, h.Revoked())
		}
	}
	if got := c.Stats().SessionsClosed; got != 1 {
		t.Fatalf("sessions closed %d, want 1", got)
	}
}
