package node_test

import (
	"net/http"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pushd/pushd/converge"
	"github.com/pushd/pushd/internal/testenv"
	"github.com/pushd/pushd/keys"
	"github.com/pushd/pushd/node"
	"github.com/pushd/pushd/snapshot/rediswrite"
)

// A Task State Service that dies between the snapshot write and its
// announcement (here: it journals and writes, as rediswrite's first two
// steps, and never announces) still reaches an SSE client watching the
// task: the node's reconcile announces the stored version, removes the
// journal entry and counts the repair. On Redis Cluster and with the cache
// and realtime roles on two Redis servers; on one standalone Redis the
// write and the announcement are one script, and nothing reconciles.
func TestUnannouncedWriteReachesWatchers(t *testing.T) {
	reconcile := converge.ReconcileConfig{Interval: 100 * time.Millisecond, Grace: 50 * time.Millisecond}
	t.Run("split", func(t *testing.T) {
		cache, realtime := testenv.StartRedis(t), testenv.StartRedis(t)
		srv := startNode(t, node.Config{RedisURL: realtime.URL, RedisCacheURL: cache.URL, Reconcile: reconcile})
		unannouncedReachesWatcher(t, srv, cache.Client(), realtime.Client(), keys.Names{})
	})
	t.Run("cluster", func(t *testing.T) {
		c := testenv.StartRedisCluster(t, 3)
		srv := startNode(t, node.Config{RedisURL: c.Seeds, RedisCluster: true, Reconcile: reconcile})
		unannouncedReachesWatcher(t, srv, c.Client(), c.Client(), clusterNames)
	})
	t.Run("one redis", func(t *testing.T) {
		r := testenv.StartRedis(t)
		srv := startNode(t, node.Config{RedisURL: r.URL, Reconcile: reconcile})
		if _, ok := testenv.Scrape(t, srv.AdminURL)["pushd_announce_reconcile_rounds_total"]; ok {
			t.Fatal("a node on one Redis reconciles")
		}
	})
}

func unannouncedReachesWatcher(t *testing.T, srv *server, cache, realtime redis.UniversalClient, names keys.Names) {
	t.Helper()
	ctx := testenv.Context(t)
	tenant, task := testenv.UniqueID("t"), testenv.UniqueID("task")
	if resp, body := httpDo(t, http.MethodPost, srv.URL+"/v1/publish", "", doc(task, tenant, 3, "RUNNING")); resp.StatusCode != http.StatusOK {
		t.Fatalf("publish %d %s", resp.StatusCode, body)
	}
	if n := realtime.Exists(ctx, names.Unannounced(tenant)).Val(); n != 0 {
		t.Fatal("a publish that announced left its journal entry")
	}
	sc := openSSE(t, srv.URL, token(t, tenant, "u1"), "task="+task)
	if sc.Status != http.StatusOK {
		t.Fatalf("SSE %d %s", sc.Status, sc.Body)
	}
	if got := sc.nextTask(t); got.Version != 3 {
		t.Fatalf("SSE got v%d first, want v3", got.Version)
	}

	s := parseDoc(t, doc(task, tenant, 4, "RUNNING"))
	if _, err := rediswrite.Journal(ctx, realtime, names, s); err != nil {
		t.Fatal(err)
	}
	if out, err := rediswrite.WriteIfNewer(ctx, cache, names, s, time.Hour); err != nil || out != rediswrite.Written {
		t.Fatalf("write = %v, %v", out, err)
	}
	// The Task State Service dies here.
	if got := sc.nextTask(t); got.TaskID != task || got.Version != 4 {
		t.Fatalf("SSE got %s v%d, want %s v4", got.TaskID, got.Version, task)
	}
	testenv.Eventually(t, "the journal empty", func() bool {
		return realtime.Exists(ctx, names.Unannounced(tenant)).Val() == 0
	})
	testenv.Eventually(t, "the repair counted", func() bool {
		return testenv.Scrape(t, srv.AdminURL)["pushd_announce_repairs_total"] == 1
	})
}
