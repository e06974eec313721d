package admission

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/pushd/pushd/internal/testenv"
	"github.com/redis/go-redis/v9"
)

// commandCalls is the calls Redis has run, by command (INFO
// commandstats), inside scripts or not.
func commandCalls(t *testing.T, rdb *redis.Client) map[string]int64 {
	t.Helper()
	info, err := rdb.Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	calls := map[string]int64{}
	for line := range strings.SplitSeq(info, "\n") {
		name, rest, ok := strings.Cut(strings.TrimPrefix(strings.TrimSpace(line), "cmdstat_"), ":calls=")
		if !ok {
			continue
		}
		n, _ := strconv.ParseInt(strings.SplitN(rest, ",", 2)[0], 10, 64)
		calls[name] = n
	}
	return calls
}

// A node's renewal runs a fixed number of Redis commands per tenant,
// however many connections and users it holds leases of: the leases are
// read and written in one command each, and the users' counts are left to
// the reconcile, whose refresh outlasts its rounds. A count's TTL is not
// shortened by a renewal.
func TestRenewCommandsDoNotGrowWithLeases(t *testing.T) {
	srv := testenv.StartRedis(t)
	rdb := srv.Client()
	c := newController(t, Config{Redis: rdb, Timeout: 2 * time.Second, MaxConnsPerUser: 5, LeaseTTL: time.Minute, RenewInterval: time.Hour,
		ReconcileInterval: time.Hour, ConnectUserBurst: -1, ConnectIPBurst: -1})
	ctx := context.Background()
	const users = 600 // more than a batch: two script calls
	for i := range users {
		if _, d := c.Connect(ctx, "t1", fmt.Sprintf("u%d", i), "", ""); !d.Allowed || d.Local {
			t.Fatalf("connect %d: %+v", i, d)
		}
	}
	c.Connect(ctx, "t1", "u0", "", "") // a user with two
	userKey := c.names.capUser("t1", "u1")
	if ttl := rdb.PTTL(ctx, userKey).Val(); ttl <= 2*time.Minute {
		t.Fatalf("a user's count expires in %v, want past two lease TTLs", ttl)
	}
	c.renew() // loads the script
	rdb.PExpire(ctx, userKey, 90*time.Second)

	before := commandCalls(t, rdb)
	c.renew()
	after := commandCalls(t, rdb)
	var total int64
	for name, n := range after {
		if d := n - before[name]; d > 0 && name != "info" {
			total += d
			t.Logf("%s: %d", name, d)
		}
	}
	// Per script call: EVALSHA, TIME, ZMSCORE, ZADD and two PEXPIRE; and
	// one SADD registering the tenant.
	if total > 2*6+1 {
		t.Fatalf("renewing %d leases ran %d commands, want at most %d", users+1, total, 2*6+1)
	}
	if got := c.Stats().LeasesReadded; got != 0 {
		t.Fatalf("re-added %d present leases", got)
	}
	if ttl := rdb.PTTL(ctx, userKey).Val(); ttl > 90*time.Second || ttl <= 0 {
		t.Fatalf("a user's count expires in %v after the renewal, want what it had, at most 90s", ttl)
	}
	// The reconcile refreshes it.
	if _, err := c.Reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	if ttl := rdb.PTTL(ctx, userKey).Val(); ttl <= 2*time.Minute {
		t.Fatalf("a user's count expires in %v after the reconcile, want past two lease TTLs", ttl)
	}
	if n := count(t, rdb, c.names.capUser("t1", "u0")); n != 2 {
		t.Fatalf("u0's count %d, want 2", n)
	}
}

// A connection refused on local limits after its acquire failed in flight
// leaves no lease behind: Redis may run the acquire after the node gave up
// on it, and the lease it writes is released a renewal or two later, once
// the acquire has surely run. Without that, its count held a slot of the
// tenant's cap until the lease expired.
func TestAcquireRunLateIsReleased(t *testing.T) {
	srv := testenv.StartRedis(t)
	proxy := testenv.StartProxy(t, srv.Addr)
	rdb := redis.NewClient(&redis.Options{Addr: proxy.Addr, MaxRetries: -1})
	t.Cleanup(func() { rdb.Close() })
	c := newController(t, Config{Redis: rdb, Timeout: 200 * time.Millisecond, MaxConnsPerTenant: 2, ExpectedNodes: 2,
		RenewInterval: time.Hour, ConnectUserBurst: -1, ConnectIPBurst: -1})
	ctx := context.Background()
	if _, d := c.Connect(ctx, "t1", "u1", "", ""); !d.Allowed || d.Local {
		t.Fatalf("first: %+v, want admitted by Redis", d)
	}
	proxy.StallAll()
	// The local share of a cap of 2 over 2 nodes is 1, which u1 holds.
	if _, d := c.Connect(ctx, "t1", "u2", "", ""); d.Allowed || !d.Local || d.Rule != RuleTenantCap {
		t.Fatalf("second, Redis stalled: %+v, want refused by the local tenant cap", d)
	}
	proxy.Pass()
	leases := srv.Client()
	testenv.Eventually(t, "the stalled acquire run", func() bool { return leases.ZCard(ctx, c.names.leases("t1")).Val() == 2 })
	c.releaseDoubtful()
	c.releaseDoubtful()
	c.flushReleases() // Redis is still taken for down: kept for later
	testenv.Eventually(t, "Redis used again", c.useRedis)
	c.flushReleases()
	if n := leases.ZCard(ctx, c.names.leases("t1")).Val(); n != 1 {
		t.Fatalf("%d leases after the release, want u1's alone", n)
	}
	if n := count(t, leases, c.names.capTenant("t1")); n != 1 {
		t.Fatalf("tenant count %d, want 1", n)
	}
}
