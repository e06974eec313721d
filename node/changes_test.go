package node_test

import (
	"context"
	"net/url"
	"os"
	"os/exec"
	"path"
	"strconv"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/pushd/pushd/db"
	"github.com/pushd/pushd/internal/testenv"
	"github.com/pushd/pushd/keys"
	"github.com/pushd/pushd/node"
)

// Changes read from PostgreSQL (--read-changes): a Task State Service that
// commits the row and nothing else.

// ownSchema is a schema of the package's database with every migration,
// for a node that reads changes: what it catches up on are this test's
// rows alone.
func ownSchema(t *testing.T) string {
	t.Helper()
	var names []string
	for _, m := range db.Migrations() {
		names = append(names, path.Base(m))
	}
	return testenv.Database(t).BareSchema(t, names...)
}

// psql runs sql in its own session and commits it, as a Task State Service
// that writes the row alone.
func psql(t *testing.T, dbURL, sql string) {
	t.Helper()
	u, err := url.Parse(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	schema := q.Get("search_path")
	q.Del("search_path")
	u.RawQuery = q.Encode()
	cmd := exec.CommandContext(testenv.Context(t), "psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", u.String(), "-c", sql)
	cmd.Env = append(os.Environ(), "PGOPTIONS=-csearch_path="+schema)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("psql %q: %v\n%s", sql, err, out)
	}
}

func waitLeading(t *testing.T, srv *server) {
	t.Helper()
	testenv.Eventually(t, "the node reads the changes", func() bool {
		return testenv.Scrape(t, srv.AdminURL)["pushd_change_reader_leading"] == 1
	})
}

// A row committed by psql alone reaches an SSE and a WebSocket client
// watching the task, and Redis holds its snapshot; a lower version
// committed after a higher one (a writer without the version guard) never
// reaches them nor Redis. On standalone Redis and on Redis Cluster.
func TestRowCommittedAloneReachesClients(t *testing.T) {
	t.Run("standalone", func(t *testing.T) {
		r := testenv.SharedRedis(t)
		dbURL := ownSchema(t)
		srv := startNode(t, node.Config{RedisURL: r.URL, KeyPrefix: r.Names.Prefix, DatabaseURL: dbURL, ReadChanges: true})
		rowAloneReaches(t, srv, dbURL, r.Client, r.Names)
	})
	t.Run("cluster", func(t *testing.T) {
		c := testenv.StartRedisCluster(t, 3)
		dbURL := ownSchema(t)
		srv := startNode(t, node.Config{RedisURL: c.Seeds, RedisCluster: true, DatabaseURL: dbURL, ReadChanges: true})
		rowAloneReaches(t, srv, dbURL, c.Client(), clusterNames)
	})
}

func rowAloneReaches(t *testing.T, srv *server, dbURL string, cache redis.UniversalClient, names keys.Names) {
	t.Helper()
	waitLeading(t, srv)
	tenant, task := testenv.UniqueID("t"), testenv.UniqueID("task")
	upsert := func(version int, status string) string {
		return `INSERT INTO generation_tasks (id, tenant_id, project_id, user_id, status, version, updated_at, extra)
			VALUES ('` + task + `', '` + tenant + `', 'p1', 'u1', '` + status + `', ` + strconv.Itoa(version) + `, now(),
				'{"output_url": "https://cdn.example/` + strconv.Itoa(version) + `.mp4"}')
			ON CONFLICT (id) DO UPDATE SET status = EXCLUDED.status, version = EXCLUDED.version,
				updated_at = EXCLUDED.updated_at, extra = EXCLUDED.extra`
	}
	psql(t, dbURL, upsert(1, "QUEUED"))

	tok := token(t, tenant, "u1")
	sse := openSSE(t, srv.URL, tok, "task="+task)
	ws := openWS(t, srv.URL, tok)
	ws.send(t, map[string]any{"op": "subscribe", "id": 1, "tasks": []string{task}})
	clients := []taskClient{{"SSE", sse.nextTask}, {"WebSocket", ws.nextTask}}
	for _, cl := range clients {
		untilVersions(t, cl, map[string]int64{task: 1})
	}
	ws.NextOf(t, "ack")

	psql(t, dbURL, upsert(2, "RUNNING"))
	psql(t, dbURL, upsert(3, "SUCCEEDED"))
	for _, cl := range clients {
		untilVersions(t, cl, map[string]int64{task: 3})
	}
	stored := parseDoc(t, cache.Get(context.Background(), names.Snapshot(task)).Val())
	if stored.Version != 3 || !strings.Contains(string(stored.JSON()), `"output_url":"https://cdn.example/3.mp4"`) {
		t.Fatalf("Redis holds %s, want v3 with its output_url", stored.JSON())
	}
	m := testenv.Scrape(t, srv.AdminURL)
	if m[`pushd_changes_published_total{outcome="stored"}`] < 2 || m[`pushd_repairs_total{found="database_newer"}`] != 0 {
		t.Fatalf("published %v rows, repaired %v: want the reader's publishes, no repair",
			m[`pushd_changes_published_total{outcome="stored"}`], m[`pushd_repairs_total{found="database_newer"}`])
	}

	// A writer without the version guard takes the row back to v2, then
	// writes v4: the clients go from v3 to v4 (untilVersions fails on a
	// version going back), and Redis never held v2.
	stale := m[`pushd_changes_published_total{outcome="stale"}`]
	psql(t, dbURL, upsert(2, "RUNNING"))
	testenv.Eventually(t, "the lower version read and left out", func() bool {
		return testenv.Scrape(t, srv.AdminURL)[`pushd_changes_published_total{outcome="stale"}`] > stale
	})
	if v := parseDoc(t, cache.Get(context.Background(), names.Snapshot(task)).Val()).Version; v != 3 {
		t.Fatalf("Redis holds v%d after a lower version was committed, want v3", v)
	}
	psql(t, dbURL, upsert(4, "SUCCEEDED"))
	for _, cl := range clients {
		untilVersions(t, cl, map[string]int64{task: 4})
	}
}
