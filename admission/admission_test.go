package admission

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pushd/pushd/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

func newController(t *testing.T, cfg Config) *Controller {
	t.Helper()
	c := New(cfg)
	t.Cleanup(c.Close)
	return c
}

func shared(t *testing.T, cfg Config) (*Controller, testenv.Redis) {
	t.Helper()
	r := testenv.SharedRedis(t)
	cfg.Redis, cfg.Prefix = r.Client, r.Names.Prefix
	if cfg.Timeout == 0 {
		cfg.Timeout = 2 * time.Second // the shared server is busy under -race; no fallback wanted here
	}
	return newController(t, cfg), r
}

func TestBucketRefusesThenRefills(t *testing.T) {
	c, r := shared(t, Config{ConnectUserBurst: 3, ConnectUserRate: 2, ConnectIPBurst: -1})
	ctx := context.Background()
	for i := range 3 {
		if d := c.connectBuckets(ctx, "t1", "u1", "10.0.0.1"); !d.Allowed || d.Local {
			t.Fatalf("connect %d: %+v, want allowed by Redis", i, d)
		}
	}
	d := c.connectBuckets(ctx, "t1", "u1", "10.0.0.1")
	if d.Allowed || d.Rule != RuleConnectUser {
		t.Fatalf("4th connect: %+v, want refused by %s", d, RuleConnectUser)
	}
	// Empty bucket, 2 tokens/s: one token is at most 500 ms away.
	if d.RetryAfter <= 0 || d.RetryAfter > 500*time.Millisecond {
		t.Fatalf("retry after %s, want (0, 500ms]", d.RetryAfter)
	}
	// Another user of the same tenant has a bucket of its own.
	if d := c.connectBuckets(ctx, "t1", "u2", "10.0.0.1"); !d.Allowed {
		t.Fatalf("another user: %+v", d)
	}
	// The key expires once a refill from empty would be complete.
	ttl := r.Client.PTTL(ctx, c.names.connUser("t1", "u1")).Val()
	if ttl <= 0 || ttl > 2500*time.Millisecond {
		t.Fatalf("bucket TTL %s, want (0, 2.5s]", ttl)
	}
	testenv.Eventually(t, "bucket refilled", func() bool { return c.connectBuckets(ctx, "t1", "u1", "10.0.0.1").Allowed })
}

func TestBucketPerIP(t *testing.T) {
	c, _ := shared(t, Config{ConnectIPBurst: 2, ConnectIPRate: 0.01, ConnectUserBurst: -1})
	ctx := context.Background()
	for range 2 {
		if d := c.connectBuckets(ctx, "t1", "u1", "10.0.0.1"); !d.Allowed {
			t.Fatalf("%+v", d)
		}
	}
	if d := c.connectBuckets(ctx, "t1", "u9", "10.0.0.1"); d.Allowed || d.Rule != RuleConnectIP {
		t.Fatalf("3rd connect from the IP: %+v, want refused by %s", d, RuleConnectIP)
	}
	if d := c.connectBuckets(ctx, "t1", "u1", "10.0.0.2"); !d.Allowed {
		t.Fatalf("another IP: %+v", d)
	}
}

func TestWindowByPlan(t *testing.T) {
	c, r := shared(t, Config{Plans: map[string]int{PlanFree: 5, PlanPro: 50}, APIWindow: time.Minute})
	ctx := context.Background()
	for i := range 5 {
		if d := c.API(ctx, "free1", "", "task"); !d.Allowed {
			t.Fatalf("call %d: %+v", i, d)
		}
	}
	d := c.API(ctx, "free1", "", "task")
	if d.Allowed || d.Rule != RuleAPI || d.RetryAfter <= 0 || d.RetryAfter > time.Minute+time.Millisecond {
		t.Fatalf("6th call: %+v, want refused with a retry within the window", d)
	}
	// Endpoints have windows of their own.
	if d := c.API(ctx, "free1", "", "tasks"); !d.Allowed {
		t.Fatalf("another endpoint: %+v", d)
	}
	if ttl := r.Client.PTTL(ctx, c.names.api("free1", "task")).Val(); ttl <= 0 || ttl > time.Minute {
		t.Fatalf("window TTL %s", ttl)
	}
	// A pro tenant, by its token's claim or by its configuration.
	for i := range 6 {
		if d := c.API(ctx, "pro1", PlanPro, "task"); !d.Allowed {
			t.Fatalf("pro call %d: %+v", i, d)
		}
	}
	r.Client.HSet(ctx, c.names.tenantConfig("pro2"), "plan", PlanPro)
	if p := c.Plan(ctx, "pro2", ""); p != PlanPro {
		t.Fatalf("configured plan %q", p)
	}
	if p := c.Plan(ctx, "nobody", "bogus"); p != PlanFree {
		t.Fatalf("unknown claim and no configuration: %q", p)
	}
}

func TestWindowSlides(t *testing.T) {
	c, _ := shared(t, Config{Plans: map[string]int{PlanFree: 2}, APIWindow: 300 * time.Millisecond})
	ctx := context.Background()
	c.API(ctx, "t1", "", "task")
	c.API(ctx, "t1", "", "task")
	if d := c.API(ctx, "t1", "", "task"); d.Allowed {
		t.Fatal("3rd call allowed")
	}
	testenv.Eventually(t, "window slid", func() bool { return c.API(ctx, "t1", "", "task").Allowed })
}

func count(t *testing.T, rdb *redis.Client, key string) int64 {
	t.Helper()
	v, err := rdb.Get(context.Background(), key).Int64()
	if err != nil && err != redis.Nil {
		t.Fatal(err)
	}
	return v
}

func TestLeaseCapsReleaseAndTTL(t *testing.T) {
	c, r := shared(t, Config{MaxConnsPerUser: 2, MaxConnsPerTenant: 3, LeaseTTL: time.Minute, ConnectUserBurst: -1, ConnectIPBurst: -1})
	ctx := context.Background()
	h1, d := c.Connect(ctx, "t1", "u1", "", "")
	if !d.Allowed {
		t.Fatal(d)
	}
	h2, _ := c.Connect(ctx, "t1", "u1", "", "")
	if _, d := c.Connect(ctx, "t1", "u1", "", ""); d.Allowed || d.Rule != RuleUserCap {
		t.Fatalf("3rd of the user: %+v", d)
	}
	if _, d := c.Connect(ctx, "t1", "u2", "", ""); !d.Allowed {
		t.Fatalf("another user: %+v", d)
	}
	if _, d := c.Connect(ctx, "t1", "u3", "", ""); d.Allowed || d.Rule != RuleTenantCap {
		t.Fatalf("4th of the tenant: %+v", d)
	}
	if n := count(t, r.Client, c.names.capUser("t1", "u1")); n != 2 {
		t.Fatalf("user count %d", n)
	}
	ttl := r.Client.PTTL(ctx, c.names.leases("t1")).Val()
	if ttl <= time.Minute || ttl > 2*time.Minute {
		t.Fatalf("leases key TTL %s, want (1m, 2m]", ttl)
	}
	score := r.Client.ZScore(ctx, c.names.leases("t1"), h1.member).Val()
	now := r.Client.Time(ctx).Val()
	if left := time.UnixMilli(int64(score)).Sub(now); left <= 50*time.Second || left > time.Minute {
		t.Fatalf("lease expires in %s, want about 1m", left)
	}
	h1.Release()
	h1.Release() // idempotent
	testenv.Eventually(t, "released in Redis", func() bool { return count(t, r.Client, c.names.capUser("t1", "u1")) == 1 })
	if _, d := c.Connect(ctx, "t1", "u1", "", ""); !d.Allowed {
		t.Fatalf("after a release: %+v", d)
	}
	if got := c.Stats().LeasesReleased; got != 1 {
		t.Fatalf("released %d", got)
	}
	h2.Release()
}

func TestLeasesOfAStoppedNodeExpire(t *testing.T) {
	cfg := Config{MaxConnsPerUser: 2, LeaseTTL: 300 * time.Millisecond, RenewInterval: time.Hour, ConnectUserBurst: -1, ConnectIPBurst: -1}
	dead, r := shared(t, cfg)
	ctx := context.Background()
	for range 2 {
		if _, d := dead.Connect(ctx, "t1", "u1", "", ""); !d.Allowed {
			t.Fatal(d)
		}
	}
	dead.Close() // the node is gone; its leases stay behind, unrenewed
	// The live node's own leases outlast the test, so only the dead
	// node's can expire.
	cfg.Redis, cfg.Prefix, cfg.Timeout, cfg.LeaseTTL = r.Client, r.Names.Prefix, 2*time.Second, time.Minute
	live := newController(t, cfg)
	if _, d := live.Connect(ctx, "t1", "u1", "", ""); d.Allowed {
		t.Fatal("admitted over the cap while the leases live")
	}
	// The two leases were taken moments apart and may expire apart: each
	// frees one slot when it does, so two admissions follow in time.
	for i := range 2 {
		testenv.Eventually(t, fmt.Sprintf("slot %d freed by expiry", i+1), func() bool {
			_, d := live.Connect(ctx, "t1", "u1", "", "")
			return d.Allowed
		})
	}
	if got := live.Stats().LeasesExpired; got != 2 {
		t.Fatalf("expired %d, want 2", got)
	}
	if n := count(t, r.Client, live.names.capUser("t1", "u1")); n != 2 {
		t.Fatalf("user count %d after both expired and two admissions, want 2", n)
	}
	if _, d := live.Connect(ctx, "t1", "u1", "", ""); d.Allowed {
		t.Fatal("admitted over the cap held by the live node's own leases")
	}
}

// TestExpiredLeasesOfOtherUsers: an acquire leaves another user's expired
// lease out of the tenant's count at once, and has it purged (its user's
// count included) by a call that declares that count's key.
func TestExpiredLeasesOfOtherUsers(t *testing.T) {
	cfg := Config{MaxConnsPerTenant: 2, LeaseTTL: time.Minute, ConnectUserBurst: -1, ConnectIPBurst: -1}
	dead, r := shared(t, cfg)
	ctx := context.Background()
	for _, u := range []string{"u1", "u2"} {
		if _, d := dead.Connect(ctx, "t1", u, "", ""); !d.Allowed {
			t.Fatal(d)
		}
	}
	dead.Close()
	// The node stopped long ago: its leases expired.
	for _, m := range r.Client.ZRange(ctx, dead.names.leases("t1"), 0, -1).Val() {
		r.Client.ZAddXX(ctx, dead.names.leases("t1"), redis.Z{Score: 1, Member: m})
	}
	cfg.Redis, cfg.Prefix, cfg.Timeout = r.Client, r.Names.Prefix, 2*time.Second
	live := newController(t, cfg)
	for _, u := range []string{"u3", "u4"} {
		if _, d := live.Connect(ctx, "t1", u, "", ""); !d.Allowed || d.Local {
			t.Fatalf("%s: %+v, want admitted by Redis", u, d)
		}
	}
	if _, d := live.Connect(ctx, "t1", "u5", "", ""); d.Allowed {
		t.Fatal("admitted over the tenant cap")
	}
	live.Close() // purges what the acquires left before it returns
	if got := live.Stats().LeasesExpired; got != 2 {
		t.Fatalf("purged %d, want 2", got)
	}
	for u, want := range map[string]int64{"u1": 0, "u2": 0, "u3": 1, "u4": 1} {
		if n := count(t, r.Client, live.names.capUser("t1", u)); n != want {
			t.Fatalf("%s's count %d, want %d", u, n, want)
		}
	}
	if n := count(t, r.Client, live.names.capTenant("t1")); n != 2 {
		t.Fatalf("tenant count %d, want 2", n)
	}
}

func TestRenewKeepsLeasesAndWritesLostOnes(t *testing.T) {
	c, r := shared(t, Config{MaxConnsPerUser: 5, LeaseTTL: 400 * time.Millisecond, RenewInterval: time.Hour, ConnectUserBurst: -1, ConnectIPBurst: -1})
	ctx := context.Background()
	h, _ := c.Connect(ctx, "t1", "u1", "", "")
	c.Connect(ctx, "t1", "u2", "", "")
	// Redis loses the tenant's state, as a restarted server would.
	r.Client.Del(ctx, c.names.leases("t1"), c.names.capTenant("t1"), c.names.capUser("t1", "u1"), c.names.capUser("t1", "u2"))
	c.renew()
	if got := c.Stats().LeasesReadded; got != 2 {
		t.Fatalf("re-added %d, want 2", got)
	}
	if n := count(t, r.Client, c.names.capTenant("t1")); n != 2 {
		t.Fatalf("tenant count %d", n)
	}
	before := r.Client.ZScore(ctx, c.names.leases("t1"), h.member).Val()
	testenv.Eventually(t, "Redis clock moves", func() bool {
		c.renew()
		return r.Client.ZScore(ctx, c.names.leases("t1"), h.member).Val() > before
	})
	if got := c.Stats().LeasesReadded; got != 2 {
		t.Fatalf("a renewal of present leases re-added: %d", got)
	}
}

func TestReconcileRepairsCounts(t *testing.T) {
	c, r := shared(t, Config{MaxConnsPerUser: 5, ConnectUserBurst: -1, ConnectIPBurst: -1})
	ctx := context.Background()
	c.Connect(ctx, "t1", "u1", "", "")
	c.Connect(ctx, "t1", "u1", "", "")
	h3, _ := c.Connect(ctx, "t1", "u2", "", "")
	h3.Release()
	testenv.Eventually(t, "released", func() bool { return count(t, r.Client, c.names.capUser("t1", "u2")) == 0 })
	c.renew() // registers the tenant
	r.Client.Set(ctx, c.names.capUser("t1", "u1"), 7, 0)
	r.Client.Set(ctx, c.names.capUser("t1", "u2"), 3, 0)
	r.Client.Set(ctx, c.names.capTenant("t1"), 1, 0)
	diff, err := c.Reconcile(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// |7-2| + |3-0| + |1-2|
	if diff != 9 || c.Stats().ReconcileDiff != 9 {
		t.Fatalf("difference %d, want 9", diff)
	}
	if u1, u2, tn := count(t, r.Client, c.names.capUser("t1", "u1")), count(t, r.Client, c.names.capUser("t1", "u2")), count(t, r.Client, c.names.capTenant("t1")); u1 != 2 || u2 != 0 || tn != 2 {
		t.Fatalf("counts after reconcile: u1 %d, u2 %d, tenant %d", u1, u2, tn)
	}
	if diff, _ := c.Reconcile(ctx); diff != 0 {
		t.Fatalf("second reconcile found %d", diff)
	}
}

func TestFallbackToLocalLimitsAndBack(t *testing.T) {
	rs := testenv.StartRedis(t)
	rdb := redis.NewClient(&redis.Options{Addr: rs.Addr, ContextTimeoutEnabled: true, DialerRetries: 1, MaxRetries: 1})
	t.Cleanup(func() { rdb.Close() })
	c := newController(t, Config{Redis: rdb, MaxConnsPerUser: 4, ExpectedNodes: 2, ConnectUserBurst: -1, ConnectIPBurst: -1,
		Timeout: 300 * time.Millisecond, RetryAfterFailure: 100 * time.Millisecond, RenewInterval: 50 * time.Millisecond, Plans: map[string]int{PlanFree: 4}})
	ctx := context.Background()
	hr, d := c.Connect(ctx, "t1", "u1", "", "")
	if !d.Allowed || d.Local {
		t.Fatalf("with Redis: %+v", d)
	}
	rs.Stop()
	// Local share: 4 / 2 nodes = 2, and the connection admitted through
	// Redis already counts on this node.
	hl, d := c.Connect(ctx, "t1", "u1", "", "")
	if !d.Allowed || !d.Local {
		t.Fatalf("Redis down: %+v, want admitted locally", d)
	}
	if _, d := c.Connect(ctx, "t1", "u1", "", ""); d.Allowed || !d.Local || d.Rule != RuleUserCap {
		t.Fatalf("over the local share: %+v", d)
	}
	if c.Stats().Fallbacks < 2 {
		t.Fatalf("fallbacks %d", c.Stats().Fallbacks)
	}
	if d := c.API(ctx, "t1", "", "task"); !d.Allowed || !d.Local {
		t.Fatalf("API with Redis down: %+v", d)
	}
	rs.Start()
	// Back on Redis: the lease taken locally is written by a renewal, so
	// Redis counts both connections, and the fleet cap (4) applies again.
	testenv.Eventually(t, "local lease written to Redis", func() bool { return c.Stats().LeasesReadded >= 2 })
	testenv.Eventually(t, "Redis decides again", func() bool {
		_, d := c.Connect(ctx, "t1", "u1", "", "")
		return d.Allowed && !d.Local
	})
	if n := count(t, rdb, c.names.capUser("t1", "u1")); n != 3 {
		t.Fatalf("user count in Redis %d, want 3", n)
	}
	// A lease taken while Redis was down is released from Redis too.
	hl.Release()
	hr.Release()
	testenv.Eventually(t, "released", func() bool { return count(t, rdb, c.names.capUser("t1", "u1")) == 1 })
}

func TestLocalOnly(t *testing.T) {
	c := newController(t, Config{ConnectUserBurst: 1, ConnectUserRate: 0.001, MaxConnsPerUser: 1})
	ctx := context.Background()
	h, d := c.Connect(ctx, "t1", "u1", "127.0.0.1", "")
	if !d.Allowed || !d.Local {
		t.Fatalf("%+v", d)
	}
	if _, d := c.Connect(ctx, "t1", "u1", "127.0.0.1", ""); d.Allowed || d.Rule != RuleConnectUser || d.RetryAfter < 900*time.Second {
		t.Fatalf("%+v", d)
	}
	if c.Stats().Fallbacks != 0 {
		t.Fatal("the embedded mode counted fallbacks")
	}
	h.Release()
}

// Ids may hold ':' (snapshot.ValidID allows it), and admission's API takes
// any string: tenant "tY:a" with user "b" and tenant "tY" with user "a:b"
// are two users, and so are the users of the pair of tenants with braces in
// their ids below, which a plain join would give one count key. Each gets a
// bucket, a window and a count of its own, in Redis and on local limits.
func TestIDsThatJoinAlikeHaveLimitsOfTheirOwn(t *testing.T) {
	cfg := Config{
		ConnectUserBurst: 1, ConnectUserRate: 0.001,
		MaxConnsPerUser: 1,
		Plans:           map[string]int{PlanFree: 1},
	}
	pairs := [][2][2]string{
		{{"tY:a", "b"}, {"tY", "a:b"}},
		{{"x", "y}:user:z"}, {"x}:user:y", "z"}},
	}
	ctx := context.Background()
	check := func(t *testing.T, c *Controller, wantLocal bool) {
		for _, p := range pairs {
			for _, id := range p {
				h, d := c.Connect(ctx, id[0], id[1], "", "")
				if !d.Allowed || d.Local != wantLocal {
					t.Errorf("first connect of tenant %q user %q: %+v, want allowed (local %v)", id[0], id[1], d, wantLocal)
					continue
				}
				t.Cleanup(h.Release)
			}
			// Each of the pair is at its limits now: one more is refused.
			for _, id := range p {
				if _, d := c.Connect(ctx, id[0], id[1], "", ""); d.Allowed || d.Rule != RuleConnectUser {
					t.Errorf("second connect of tenant %q user %q: %+v, want refused by %s", id[0], id[1], d, RuleConnectUser)
				}
			}
			// The API window: tenant and endpoint join the same way.
			for _, id := range p {
				if d := c.API(ctx, id[0], "", id[1]); !d.Allowed {
					t.Errorf("first call of tenant %q to endpoint %q: %+v, want allowed", id[0], id[1], d)
				}
			}
		}
	}
	t.Run("redis", func(t *testing.T) {
		c, _ := shared(t, cfg)
		check(t, c, false)
	})
	t.Run("local", func(t *testing.T) {
		check(t, newController(t, cfg), true)
	})

	// The fleet caps, without the bucket in front of them.
	t.Run("caps", func(t *testing.T) {
		c, _ := shared(t, Config{MaxConnsPerUser: 1})
		for _, p := range pairs {
			for _, id := range p {
				h, d := c.Connect(ctx, id[0], id[1], "", "")
				if !d.Allowed {
					t.Errorf("first connection of tenant %q user %q: %+v, want allowed", id[0], id[1], d)
					continue
				}
				t.Cleanup(h.Release)
			}
		}
	})
}

// ruleStats finds the counters of rule at endpoint; ok is false when the
// rule was never checked there.
func ruleStats(s Stats, endpoint, rule string) (RuleStats, bool) {
	for _, r := range s.Rules {
		if r.Endpoint == endpoint && r.Rule == rule {
			return r, true
		}
	}
	return RuleStats{}, false
}

// Each check is counted under its endpoint and each rule it checked: passes
// of every rule checked (a connect refused by its user's bucket still
// passed its IP's), the refusal of the rule that refused with the wait it
// asked for, and a round trip to Redis per rule checked in it. A rule
// that is off (here the tenant cap) has no counters at all.
func TestRuleStatsByEndpoint(t *testing.T) {
	c, _ := shared(t, Config{ConnectUserBurst: 2, ConnectUserRate: 0.001, ConnectIPBurst: 10, ConnectIPRate: 1,
		MaxConnsPerUser: 1, Plans: map[string]int{PlanFree: 1}})
	ctx := context.Background()
	user := testenv.UniqueID("u")
	h, d := c.Connect(ctx, "t1", user, "10.0.0.1", "")
	if !d.Allowed {
		t.Fatalf("1st connect: %+v", d)
	}
	defer h.Release()
	capped, capD := c.Connect(ctx, "t1", user, "10.0.0.1", "")
	if capped != nil || capD.Rule != RuleUserCap {
		t.Fatalf("2nd connect: %+v, want refused by %s", capD, RuleUserCap)
	}
	_, bucketD := c.Connect(ctx, "t1", user, "10.0.0.1", "")
	if bucketD.Rule != RuleConnectUser {
		t.Fatalf("3rd connect: %+v, want refused by %s", bucketD, RuleConnectUser)
	}
	tenant := testenv.UniqueID("t")
	if d := c.API(ctx, tenant, "", "task"); !d.Allowed {
		t.Fatalf("1st call: %+v", d)
	}
	apiD := c.API(ctx, tenant, "", "task")
	if apiD.Allowed {
		t.Fatalf("2nd call: %+v, want refused", apiD)
	}

	s := c.Stats()
	for _, w := range []struct {
		endpoint, rule    string
		allowed, rejected int64
		retry             time.Duration // the sum of the waits asked for
		trips             uint64        // round trips to Redis
	}{
		{EndpointConnect, RuleConnectIP, 3, 0, 0, 3},
		{EndpointConnect, RuleConnectUser, 2, 1, bucketD.RetryAfter, 3},
		{EndpointConnect, RuleUserCap, 1, 1, capD.RetryAfter, 2},
		{"task", RuleAPI, 1, 1, apiD.RetryAfter, 2},
	} {
		r, ok := ruleStats(s, w.endpoint, w.rule)
		if !ok {
			t.Errorf("%s %s: no counters", w.endpoint, w.rule)
			continue
		}
		if r.Allowed != w.allowed || r.Rejected != w.rejected {
			t.Errorf("%s %s: allowed %d, rejected %d; want %d, %d", w.endpoint, w.rule, r.Allowed, r.Rejected, w.allowed, w.rejected)
		}
		if r.RetryAfter.Count != uint64(w.rejected) || r.RetryAfter.Sum != w.retry {
			t.Errorf("%s %s: %d waits summing to %s, want %d summing to %s", w.endpoint, w.rule, r.RetryAfter.Count, r.RetryAfter.Sum, w.rejected, w.retry)
		}
		if r.LuaLatency.Count != w.trips {
			t.Errorf("%s %s: %d round trips timed, want %d", w.endpoint, w.rule, r.LuaLatency.Count, w.trips)
		}
	}
	for _, k := range [][2]string{{EndpointConnect, RuleTenantCap}, {EndpointConnect, RuleAPI}, {"task", RuleConnectUser}} {
		if _, ok := ruleStats(s, k[0], k[1]); ok {
			t.Errorf("%s %s: counters of a rule never checked there", k[0], k[1])
		}
	}
	if len(s.Rules) != 4 {
		t.Errorf("%d rule counters, want 4: %+v", len(s.Rules), s.Rules)
	}
	// The sums by rule.
	if s.Allowed[RuleConnectIP] != 3 || s.Allowed[RuleTenantCap] != 0 || s.Rejected[RuleUserCap] != 1 || s.Rejected[RuleAPI] != 1 {
		t.Errorf("by rule: allowed %v, rejected %v", s.Allowed, s.Rejected)
	}
}

// Endpoint names are the callers', but past maxEndpoints of them the rest
// are counted as EndpointOther, so the labels stay bounded.
func TestRuleStatsEndpointsBounded(t *testing.T) {
	c := newController(t, Config{Plans: map[string]int{PlanFree: 100}})
	ctx := context.Background()
	for i := range maxEndpoints + 3 {
		c.API(ctx, "t1", "", fmt.Sprintf("e%d", i))
	}
	c.API(ctx, "t1", "", "e0")
	s := c.Stats()
	if len(s.Rules) != maxEndpoints+1 {
		t.Fatalf("%d endpoints counted, want %d and %s", len(s.Rules), maxEndpoints, EndpointOther)
	}
	if r, _ := ruleStats(s, "e0", RuleAPI); r.Allowed != 2 {
		t.Errorf("e0: %d allowed, want 2", r.Allowed)
	}
	if r, _ := ruleStats(s, EndpointOther, RuleAPI); r.Allowed != 3 {
		t.Errorf("%s: %d allowed, want 3", EndpointOther, r.Allowed)
	}
}

// TestCallerGivingUpTripsNothing: a client that went away while its
// admission check was on its way says nothing of the store: the next
// client's check is still decided by Redis, not by local limits.
func TestCallerGivingUpTripsNothing(t *testing.T) {
	c, _ := shared(t, Config{MaxConnsPerUser: 4, ConnectUserBurst: 3, ConnectUserRate: 2, ConnectIPBurst: -1})
	gone, cancel := context.WithCancel(context.Background())
	cancel()
	if h, _ := c.Connect(gone, "t1", "u1", "", ""); h != nil {
		h.Release()
	}
	if n := c.Stats().StoreErrors; n != 0 {
		t.Errorf("%d store errors counted for a caller that gave up", n)
	}
	h, d := c.Connect(context.Background(), "t1", "u2", "", "")
	if !d.Allowed || d.Local {
		t.Fatalf("the next client's check: %+v, want decided by Redis", d)
	}
	h.Release()
}
