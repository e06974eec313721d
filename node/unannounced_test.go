package node_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pushd/pushd/hub"
	"github.com/pushd/pushd/internal/testenv"
	"github.com/pushd/pushd/keys"
	"github.com/pushd/pushd/node"
	"github.com/pushd/pushd/snapshot"
)

// Changes written and never announced: the repair rounds.

// testRepairInterval is the tests' --repair-interval; the bound every
// client is held to is the interval plus a second.
const testRepairInterval = 2 * time.Second

func (c *cluster) repairConfig() node.Config {
	cfg := c.config()
	cfg.Hub.RepairInterval = testRepairInterval
	return cfg
}

// rowAndSnapshot is a normal publish of a task: its row committed, then
// its snapshot stored and announced.
func (c *cluster) rowAndSnapshot(t *testing.T, task, tenant string, version int64) {
	t.Helper()
	c.pg.InsertTask(t, testenv.Task{ID: task, TenantID: tenant, ProjectID: "p1", UserID: "u1", Status: "RUNNING", Progress: 40, Version: version})
	c.goPublish(t, doc(task, tenant, version, "RUNNING"))
}

// setByHand stores a snapshot as a writer by hand does (a plain SET) and
// announces nothing.
func (c *cluster) setByHand(t *testing.T, d string) {
	t.Helper()
	s := parseDoc(t, d)
	if err := c.redis.Client.Set(context.Background(), c.redis.Names.Snapshot(s.TaskID), d, time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
}

// taskClient is an SSE or a WebSocket client reduced to its task events.
type taskClient struct {
	name string
	next func(t *testing.T) *snapshot.Snapshot
}

// untilVersions reads task events until every task of want arrived in its
// version, and fails on an older version after a newer one.
func untilVersions(t *testing.T, cl taskClient, want map[string]int64) {
	t.Helper()
	have := make(map[string]int64)
	for done := 0; done < len(want); {
		s := cl.next(t)
		if s.Version < have[s.TaskID] {
			t.Fatalf("%s: %s went from v%d to v%d", cl.name, s.TaskID, have[s.TaskID], s.Version)
		}
		have[s.TaskID] = s.Version
		if v, ok := want[s.TaskID]; ok && s.Version == v {
			done++
		}
	}
}

// withinBound fails unless d is within the repair interval plus a second.
func withinBound(t *testing.T, what string, d time.Duration) {
	t.Helper()
	t.Logf("%s after %v", what, d.Round(time.Millisecond))
	if bound := testRepairInterval + time.Second; d > bound {
		t.Fatalf("%s after %v, want within the repair interval %v + 1s", what, d.Round(time.Millisecond), testRepairInterval)
	}
}

// A writer that committed a row and died before Redis (case A), and one
// that stored the snapshot and died before announcing it (case B): both
// changes reach an SSE and a WebSocket client watching them, among quiet
// tasks, within the repair interval plus a second. The node counts and
// tells what it found, and a client never sees a version go backwards.
func TestChangeNeverAnnouncedReachesWatchers(t *testing.T) {
	c := newCluster(t)
	srv := startNode(t, c.repairConfig())
	tenant := testenv.UniqueID("t")
	dbOnly, redisOnly := testenv.UniqueID("dbonly"), testenv.UniqueID("redisonly")
	tasks := []string{dbOnly, redisOnly}
	for range 20 {
		tasks = append(tasks, testenv.UniqueID("quiet"))
	}
	for _, id := range tasks {
		c.rowAndSnapshot(t, id, tenant, 1)
	}
	tok := token(t, tenant, "u1")
	sse := openSSE(t, srv.URL, tok, "task="+strings.Join(tasks, "&task="))
	ws := openWS(t, srv.URL, tok)
	ws.send(t, map[string]any{"op": "subscribe", "id": 1, "tasks": tasks})
	clients := []taskClient{{"SSE", sse.nextTask}, {"WebSocket", ws.nextTask}}
	initial := make(map[string]int64)
	for _, id := range tasks {
		initial[id] = 1
	}
	for _, cl := range clients {
		untilVersions(t, cl, initial)
	}
	ws.NextOf(t, "ack")

	// Case A: PostgreSQL has v2, Redis still v1, no hint.
	c.pg.InsertTask(t, testenv.Task{ID: dbOnly, TenantID: tenant, ProjectID: "p1", UserID: "u1", Status: "SUCCEEDED", Progress: 100, Version: 2})
	// Case B: PostgreSQL and Redis have v2, no hint.
	c.pg.InsertTask(t, testenv.Task{ID: redisOnly, TenantID: tenant, ProjectID: "p1", UserID: "u1", Status: "RUNNING", Progress: 45, Version: 2})
	c.setByHand(t, doc(redisOnly, tenant, 2, "RUNNING"))
	written := time.Now()
	for _, cl := range clients {
		untilVersions(t, cl, map[string]int64{dbOnly: 2, redisOnly: 2})
		withinBound(t, cl.name+" had both changes", time.Since(written))
	}
	if s := parseDoc(t, c.redis.Client.Get(context.Background(), c.redis.Names.Snapshot(dbOnly)).Val()); s.Version != 2 || s.Status != "SUCCEEDED" {
		t.Fatalf("Redis holds %s v%d %s after the repair, want v2 SUCCEEDED", dbOnly, s.Version, s.Status)
	}
	testenv.Eventually(t, "the repairs counted", func() bool {
		m := testenv.Scrape(t, srv.AdminURL)
		return m[`pushd_repairs_total{found="database_newer"}`] == 1 && m[`pushd_repairs_total{found="redis_newer"}`] == 1 &&
			m["pushd_repair_age_seconds_count"] == 2
	})
	m := testenv.Scrape(t, srv.AdminURL)
	if m["pushd_repair_checked_total"] < float64(len(tasks)) || m["pushd_repair_db_queries_total"] < 1 || m["pushd_repair_db_rows_total"] < float64(len(tasks)) {
		t.Fatalf("repair checked %v tasks in %v queries reading %v rows, want at least %d, 1, %d",
			m["pushd_repair_checked_total"], m["pushd_repair_db_queries_total"], m["pushd_repair_db_rows_total"], len(tasks), len(tasks))
	}
}

// A change never announced reaches a project-scope (SSE) and a user-scope
// (WebSocket) subscription that hold the task from their listing.
func TestChangeNeverAnnouncedReachesScopes(t *testing.T) {
	c := newCluster(t)
	srv := startNode(t, c.repairConfig())
	tenant := testenv.UniqueID("t")
	task := testenv.UniqueID("task")
	c.rowAndSnapshot(t, task, tenant, 1)
	tok := token(t, tenant, "u1")
	sse := openSSE(t, srv.URL, tok, "project=p1")
	ws := openWS(t, srv.URL, tok)
	ws.send(t, map[string]any{"op": "subscribe", "id": 1, "scope": "user"})
	clients := []taskClient{{"SSE project scope", sse.nextTask}, {"WebSocket user scope", ws.nextTask}}
	for _, cl := range clients {
		untilVersions(t, cl, map[string]int64{task: 1})
	}
	ws.NextOf(t, "ack")
	c.pg.InsertTask(t, testenv.Task{ID: task, TenantID: tenant, ProjectID: "p1", UserID: "u1", Status: "POST_PROCESSING", Progress: 90, Version: 2})
	written := time.Now()
	for _, cl := range clients {
		untilVersions(t, cl, map[string]int64{task: 2})
		withinBound(t, cl.name+" had the change", time.Since(written))
	}
}

// Tasks created in a watched scope and never announced, one whose writer
// died before Redis (case A) and one stored without a hint (case B), reach
// a project-scope SSE and a user-scope WebSocket subscription that never
// held them, within the repair interval plus a second: the scopes' listing
// finds them. On Redis Cluster and split Redis too.
func TestTaskCreatedNeverAnnouncedReachesScopes(t *testing.T) {
	t.Run("standalone", func(t *testing.T) {
		c := newCluster(t)
		srv := startNode(t, c.repairConfig())
		createdNeverAnnouncedReachesScopes(t, srv, c.pg, c.redis.Client, c.redis.Names)
	})
	onClusterAndSplitRedis(t, createdNeverAnnouncedReachesScopes)
}

func createdNeverAnnouncedReachesScopes(t *testing.T, srv *server, pg testenv.Postgres, cache redis.UniversalClient, names keys.Names) {
	t.Helper()
	tenant := testenv.UniqueID("t")
	seed, dbOnly, redisOnly := testenv.UniqueID("seed"), testenv.UniqueID("dbonly"), testenv.UniqueID("redisonly")
	pg.InsertTask(t, testenv.Task{ID: seed, TenantID: tenant, ProjectID: "p1", UserID: "u1", Status: "RUNNING", Version: 1})
	httpPublish(t, srv.URL, doc(seed, tenant, 1, "RUNNING"))
	tok := token(t, tenant, "u1")
	sse := openSSE(t, srv.URL, tok, "project=p1")
	ws := openWS(t, srv.URL, tok)
	ws.send(t, map[string]any{"op": "subscribe", "id": 1, "scope": "user"})
	clients := []taskClient{{"SSE project scope", sse.nextTask}, {"WebSocket user scope", ws.nextTask}}
	for _, cl := range clients {
		untilVersions(t, cl, map[string]int64{seed: 1})
	}
	ws.NextOf(t, "ack")

	pg.InsertTask(t, testenv.Task{ID: dbOnly, TenantID: tenant, ProjectID: "p1", UserID: "u1", Status: "QUEUED", Version: 1})
	pg.InsertTask(t, testenv.Task{ID: redisOnly, TenantID: tenant, ProjectID: "p1", UserID: "u1", Status: "RUNNING", Version: 1})
	if err := cache.Set(context.Background(), names.Snapshot(redisOnly), doc(redisOnly, tenant, 1, "RUNNING"), time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	written := time.Now()
	for _, cl := range clients {
		untilVersions(t, cl, map[string]int64{dbOnly: 1, redisOnly: 1})
		withinBound(t, cl.name+" had both new tasks", time.Since(written))
	}
	// The node counts a repair once its publish returned, which may be
	// after the client had it.
	testenv.Eventually(t, "the repair and the announcement counted", func() bool {
		m := testenv.Scrape(t, srv.AdminURL)
		return m[`pushd_repairs_total{found="database_newer"}`] == 1 && m["pushd_repair_scopes_listed_total"] >= 1 && m["pushd_repair_announced_total"] >= 1
	})
	// The round that found them ended after they were written, in a slot
	// that started at most an interval before.
	m := testenv.Scrape(t, srv.AdminURL)
	if last := time.UnixMilli(int64(m["pushd_repair_last_round_timestamp_seconds"] * 1e3)); last.Before(written.Add(-testRepairInterval)) {
		t.Fatalf("pushd_repair_last_round_timestamp_seconds is %v, before the tasks were written (%v) less an interval", last, written)
	}
}

// The fleet lists each watched scope once per interval whatever the
// number of nodes watching it: three nodes watching one project and one
// user list what one node alone lists, one query of each kind per round.
func TestScopeListingCostDoesNotGrowWithNodes(t *testing.T) {
	c := newCluster(t)
	cfg := c.repairConfig()
	tenant := testenv.UniqueID("t")
	seed := testenv.UniqueID("seed")
	c.rowAndSnapshot(t, seed, tenant, 1)
	watch := func(srv *server) {
		ws := openWS(t, srv.URL, token(t, tenant, "u1"))
		ws.send(t, map[string]any{"op": "subscribe", "id": 1, "projects": []string{"p1"}})
		untilVersions(t, taskClient{"WebSocket", ws.nextTask}, map[string]int64{seed: 1})
		ws.NextOf(t, "ack")
		ws.send(t, map[string]any{"op": "subscribe", "id": 2, "scope": "user"})
		ws.NextOf(t, "ack")
	}
	alone, three := aloneThenThree(t, cfg, watch)
	t.Logf("three intervals, one node: %d scopes listed in %d queries; three nodes: %d in %d", alone.scopes, alone.queries, three.scopes, three.queries)
	// Each round: the seed's check by id, and one listing of each kind.
	if alone.scopes != 6 || alone.queries != 9 {
		t.Fatalf("one node: %d scopes listed in %d queries in three intervals, want 6 in 9", alone.scopes, alone.queries)
	}
	if three.scopes != alone.scopes || float64(three.queries) > 1.2*float64(alone.queries) {
		t.Fatalf("three nodes: %d scopes listed in %d queries, want %d in at most 1.2 times %d", three.scopes, three.queries, alone.scopes, alone.queries)
	}
}

// The fleet checks each watched task against PostgreSQL once per interval
// whatever the number of nodes watching it: three nodes watching the same
// 1,000 quiet tasks read what one node alone reads (at most 1.2 times),
// one query of versions per interval, each task's version once.
func TestRepairCostDoesNotGrowWithNodes(t *testing.T) {
	c := newCluster(t)
	cfg := c.repairConfig()
	cfg.Hub.MaxSubscriptions, cfg.Hub.MaxIDs, cfg.Hub.SubscribeReadBurst = 1000, 1000, 5000
	tenant := testenv.UniqueID("t")
	const n = 1000
	tasks := make([]string, n)
	for i := range tasks {
		tasks[i] = fmt.Sprintf("%s_%04d", testenv.UniqueID("quiet"), i)
	}
	insertTasks(t, c.pg, tenant, tasks)
	watch := func(srv *server) {
		ws := openWS(t, srv.URL, token(t, tenant, "u1"))
		ws.send(t, map[string]any{"op": "subscribe", "id": 1, "tasks": tasks})
		// The tasks and the ack in any order: on a loaded machine the
		// subscribe may outlast its timeout, and the tasks it did not read
		// (acked unavailable) arrive from the poll loop after the ack.
		for got, acked := 0, false; got < n || !acked; {
			switch m := ws.Next(t); msgType(m) {
			case "task":
				got++
			case "ack":
				acked = true
			default:
				t.Fatalf("got %s while watching the quiet tasks", rawString(m))
			}
		}
	}
	alone, three := aloneThenThree(t, cfg, watch)
	t.Logf("three intervals, one node: %d queries, %d rows; three nodes: %d queries, %d rows", alone.queries, alone.rows, three.queries, three.rows)
	if alone.queries != 3 || alone.rows != 3*n {
		t.Fatalf("one node: %d queries reading %d rows in three intervals, want 3 and %d", alone.queries, alone.rows, 3*n)
	}
	if float64(three.queries) > 1.2*float64(alone.queries) || float64(three.rows) > 1.2*float64(alone.rows) {
		t.Fatalf("three nodes: %d queries reading %d rows, want at most 1.2 times one node's %d and %d", three.queries, three.rows, alone.queries, alone.rows)
	}
}

// insertTasks inserts RUNNING rows of version 1, in one statement.
func insertTasks(t *testing.T, pg testenv.Postgres, tenant string, ids []string) {
	t.Helper()
	_, err := pg.Pool.Exec(context.Background(), `
		INSERT INTO generation_tasks (id, tenant_id, project_id, user_id, status, progress, version)
		SELECT id, $2, 'p1', 'u1', 'RUNNING', 10, 1 FROM unnest($1::text[]) AS id`, ids, tenant)
	if err != nil {
		t.Fatal(err)
	}
}

type repairCost struct{ queries, rows, scopes uint64 }

// aloneThenThree measures three repair slots of one node whose clients
// watch what watch subscribes to, then of three such nodes.
func aloneThenThree(t *testing.T, cfg node.Config, watch func(*server)) (alone, three repairCost) {
	t.Helper()
	nodes := []*server{startNode(t, cfg)}
	watch(nodes[0])
	alone = measureRepair(t, nodes, cfg.Hub.RepairInterval, 3)
	for range 2 {
		srv := startNode(t, cfg)
		watch(srv)
		nodes = append(nodes, srv)
	}
	return alone, measureRepair(t, nodes, cfg.Hub.RepairInterval, 3)
}

// repairSample is the nodes' repair reads summed at a moment no node was
// in a round: the rounds each had ended, and the latest slot among them.
type repairSample struct {
	rounds []uint64
	slot   time.Time
	cost   repairCost
}

// measureRepair sums the nodes' repair reads of PostgreSQL over the given
// number of repair slots. Each slot, the fleet claims each task's check
// once, whichever node runs it first, so the cost is the fleet's per slot.
// The sums are read at moments no node is in a round, checked on both
// sides of the read, so no round's reads are half in them. A node may
// skip a slot (a round that found PostgreSQL busy or slow backs off, one
// that outlasted its slot misses the next), and a sample may come late
// (a test goroutine starved for an interval): the sums cover the slots
// between the two samples' latest, or the rounds the busiest node ran if
// fewer, and are scaled back to the slots asked for.
func measureRepair(t *testing.T, nodes []*server, interval time.Duration, slots int64) repairCost {
	t.Helper()
	idle := func() (rounds []uint64, latest time.Time, ok bool) {
		for _, srv := range nodes {
			st := srv.Repairer().Stats()
			if st.Running {
				return nil, time.Time{}, false
			}
			rounds = append(rounds, st.Rounds)
			if st.Slot.After(latest) {
				latest = st.Slot
			}
		}
		return rounds, latest, true
	}
	sample := func(from time.Time) repairSample {
		t.Helper()
		var s repairSample
		testenv.EventuallyWithin(t, fmt.Sprintf("a moment between rounds, after the slot of %s", from.Format("15:04:05.000")), testenv.Wait+time.Duration(slots)*interval, func() bool {
			var ok bool
			if s.rounds, s.slot, ok = idle(); !ok || s.slot.Before(from) {
				return false
			}
			s.cost = repairCost{}
			for _, srv := range nodes {
				st := srv.Repairer().Stats()
				s.cost.queries += st.CheckQueries
				s.cost.rows += st.CheckRows
				s.cost.scopes += st.ScopesListed
			}
			after, _, ok := idle()
			return ok && slices.Equal(after, s.rounds)
		})
		return s
	}
	first := sample(time.Unix(0, 1)) // some node ended a round
	last := sample(first.slot.Add(time.Duration(slots) * interval))
	n := int64(last.slot.Sub(first.slot) / interval)
	ran := int64(0)
	for i := range nodes {
		ran = max(ran, int64(last.rounds[i]-first.rounds[i]))
	}
	n = min(n, ran)
	if n != slots {
		t.Logf("measured %d slots for %d", n, slots)
	}
	scale := func(v uint64) uint64 { return v * uint64(slots) / uint64(n) }
	return repairCost{scale(last.cost.queries - first.cost.queries), scale(last.cost.rows - first.cost.rows), scale(last.cost.scopes - first.cost.scopes)}
}

// docNow is doc changed a moment ago, 1.5 s: a repair counts a change
// over a second old (a younger one's hint may be on its way still), and a
// round may come at once.
func docNow(task, tenant string, version int64) string {
	return docAt(task, tenant, version, time.Now().Add(-1500*time.Millisecond))
}

// docAt is doc with an updated_at of at.
func docAt(task, tenant string, version int64, at time.Time) string {
	return strings.Replace(doc(task, tenant, version, "RUNNING"), `"updated_at":1710000000000`, fmt.Sprintf(`"updated_at":%d`, at.UnixMilli()), 1)
}

// With streams, a change stored and announced but never appended to the
// stream, made while the client reconnects, is not replayed after the
// client's cursor; the repair round still brings it, within the interval
// plus a second. The quiet tasks the client holds are not sent again. A
// WebSocket client has no such gap: its subscribe reads the current state,
// since only spares it the versions it holds.
func TestChangeMissingFromTheStreamReachesAResumedClient(t *testing.T) {
	c := newCluster(t)
	cfg := c.streamConfig()
	cfg.Hub.RepairInterval = testRepairInterval
	srv := startNode(t, cfg)
	tenant := testenv.UniqueID("t")
	moved := testenv.UniqueID("moved")
	tasks := []string{moved}
	for range 10 {
		tasks = append(tasks, testenv.UniqueID("quiet"))
	}
	for _, id := range tasks {
		c.pg.InsertTask(t, testenv.Task{ID: id, TenantID: tenant, ProjectID: "p1", UserID: "u1", Status: "RUNNING", Version: 1})
		streamPublish(t, c.redis.Client, c.redis.Names, tenantDoc(id, tenant, 1))
	}
	tok, query := token(t, tenant, "u1"), "task="+strings.Join(tasks, "&task=")
	first := openSSE(t, srv.URL, tok, query)
	initial, cursorID := first.untilCursor(t)
	if len(initial) != len(tasks) {
		t.Fatalf("initial state: %d tasks, want %d", len(initial), len(tasks))
	}
	first.Close()
	testenv.Eventually(t, "the first connection gone", func() bool { return srv.Hub().Len() == 0 })

	// SET and PUBLISH, no XADD, while the client is away: the node hears
	// the hint with nobody watching.
	unwatched := srv.Hub().Stats().DispatchNoWatch
	c.pg.InsertTask(t, testenv.Task{ID: moved, TenantID: tenant, ProjectID: "p1", UserID: "u1", Status: "RUNNING", Progress: 45, Version: 2})
	c.tssWrite(t, docNow(moved, tenant, 2))
	written := time.Now()
	testenv.Eventually(t, "the hint heard, unwatched", func() bool { return srv.Hub().Stats().DispatchNoWatch > unwatched })
	again := openSSE(t, srv.URL, tok, query, "Last-Event-ID", cursorID)
	if replayed, _ := again.untilCursor(t); len(replayed) != 0 {
		t.Fatalf("the resume replayed %d tasks, want none: the stream lacks the change", len(replayed))
	}
	if s := again.nextTask(t); s.TaskID != moved || s.Version != 2 {
		t.Fatalf("after the resume got %s v%d, want %s v2", s.TaskID, s.Version, moved)
	}
	withinBound(t, "the resumed client had the change the stream lacks", time.Since(written))
	if st := srv.Hub().Stats(); st.Resumes != 1 {
		t.Fatalf("%d resumes, want the reconnect served by the stream", st.Resumes)
	}
	// The round that brought it went over every watched task: once it is
	// done, a change published now is the next event, no quiet task resent.
	rounds := srv.Repairer().Stats().Rounds
	testenv.Eventually(t, "the repair round done", func() bool { return srv.Repairer().Stats().Rounds > rounds })
	streamPublish(t, c.redis.Client, c.redis.Names, tenantDoc(tasks[1], tenant, 2))
	if s := again.nextTask(t); s.TaskID != tasks[1] || s.Version != 2 {
		t.Fatalf("after the repair got %s v%d, want %s v2: a quiet task was sent again", s.TaskID, s.Version, tasks[1])
	}
	// Its v1 was appended shortly before the cursor: the resume recorded
	// that the client held it, so v2 repaired an older version.
	testenv.Eventually(t, "the repair counted", func() bool {
		return testenv.Scrape(t, srv.AdminURL)[`pushd_repairs_total{found="redis_newer"}`] == 1
	})

	// A WebSocket client back over the same kind of gap, with the
	// versions it holds: its subscribe reads the current state.
	c.pg.InsertTask(t, testenv.Task{ID: moved, TenantID: tenant, ProjectID: "p1", UserID: "u1", Status: "RUNNING", Progress: 50, Version: 3})
	c.tssWrite(t, docNow(moved, tenant, 3))
	if s := again.nextTask(t); s.TaskID != moved || s.Version != 3 {
		t.Fatalf("the SSE client got %s v%d, want %s v3", s.TaskID, s.Version, moved)
	}
	ws := openWS(t, srv.URL, tok)
	ws.send(t, map[string]any{"op": "subscribe", "id": 1, "tasks": []string{moved}, "since": map[string]int64{moved: 2}})
	untilVersions(t, taskClient{"WebSocket", ws.nextTask}, map[string]int64{moved: 3})
}

// Cases A and B on Redis Cluster (a claim per task, in its slot, and a
// publish in three steps) and with the cache and realtime roles on two
// Redis servers.
func TestChangeNeverAnnouncedReachesWatchersOnEveryRedisMode(t *testing.T) {
	onClusterAndSplitRedis(t, neverAnnouncedReaches)
}

// onClusterAndSplitRedis runs f against a node with the tests' repair
// interval on a private Redis Cluster, then on two Redis servers holding
// the cache and realtime roles apart: cache is where f finds the snapshots.
func onClusterAndSplitRedis(t *testing.T, f func(t *testing.T, srv *server, pg testenv.Postgres, cache redis.UniversalClient, names keys.Names)) {
	pg := testenv.Database(t)
	t.Run("cluster", func(t *testing.T) {
		c := testenv.StartRedisCluster(t, 3)
		srv := startNode(t, node.Config{RedisURL: c.Seeds, RedisCluster: true, DatabaseURL: pg.URL, Hub: hub.Config{RepairInterval: testRepairInterval}})
		f(t, srv, pg, c.Client(), clusterNames)
	})
	t.Run("split", func(t *testing.T) {
		cache, realtime := testenv.StartRedis(t), testenv.StartRedis(t)
		srv := startNode(t, node.Config{RedisURL: realtime.URL, RedisCacheURL: cache.URL, DatabaseURL: pg.URL, Hub: hub.Config{RepairInterval: testRepairInterval}})
		f(t, srv, pg, cache.Client(), keys.Names{})
	})
}

func neverAnnouncedReaches(t *testing.T, srv *server, pg testenv.Postgres, cache redis.UniversalClient, names keys.Names) {
	t.Helper()
	tenant := testenv.UniqueID("t")
	dbOnly, redisOnly := testenv.UniqueID("dbonly"), testenv.UniqueID("redisonly")
	for _, id := range []string{dbOnly, redisOnly} {
		pg.InsertTask(t, testenv.Task{ID: id, TenantID: tenant, ProjectID: "p1", UserID: "u1", Status: "RUNNING", Version: 1})
		httpPublish(t, srv.URL, doc(id, tenant, 1, "RUNNING"))
	}
	sse := openSSE(t, srv.URL, token(t, tenant, "u1"), "task="+dbOnly+"&task="+redisOnly)
	cl := taskClient{"SSE", sse.nextTask}
	untilVersions(t, cl, map[string]int64{dbOnly: 1, redisOnly: 1})
	pg.InsertTask(t, testenv.Task{ID: dbOnly, TenantID: tenant, ProjectID: "p1", UserID: "u1", Status: "FAILED", Version: 2})
	pg.InsertTask(t, testenv.Task{ID: redisOnly, TenantID: tenant, ProjectID: "p1", UserID: "u1", Status: "RUNNING", Version: 2})
	if err := cache.Set(context.Background(), names.Snapshot(redisOnly), doc(redisOnly, tenant, 2, "RUNNING"), time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	written := time.Now()
	untilVersions(t, cl, map[string]int64{dbOnly: 2, redisOnly: 2})
	withinBound(t, "SSE had both changes", time.Since(written))
	testenv.Eventually(t, "the repairs counted", func() bool {
		m := testenv.Scrape(t, srv.AdminURL)
		return m[`pushd_repairs_total{found="database_newer"}`] == 1 && m[`pushd_repairs_total{found="redis_newer"}`] == 1
	})
}
