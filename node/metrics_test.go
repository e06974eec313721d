package node_test

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/pushd/pushd/admission"
	"github.com/pushd/pushd/internal/testenv"
	"github.com/pushd/pushd/node"
)

// The series the scripted session accounts for. Every step states how far
// each one moves; one it does not name must not move.
var sessionSeries = []string{
	`sse_push_total`,
	`websocket_push_total`,
	`client_reconnect_total{transport="sse"}`,
	`client_reconnect_total{transport="websocket"}`,
	`task_snapshot_refetch_total{outcome="hit",source="local_cache"}`,
	`task_snapshot_refetch_total{outcome="miss",source="local_cache"}`,
	`task_snapshot_refetch_total{outcome="not_found",source="local_cache"}`,
	`task_snapshot_refetch_total{outcome="hit",source="redis"}`,
	`task_snapshot_refetch_total{outcome="miss",source="redis"}`,
	`task_snapshot_refetch_total{outcome="not_found",source="redis"}`,
	`task_snapshot_refetch_total{outcome="error",source="redis"}`,
	`task_snapshot_refetch_total{outcome="skipped",source="redis"}`,
	`task_snapshot_refetch_total{outcome="hit",source="postgres"}`,
	`task_snapshot_refetch_total{outcome="miss",source="postgres"}`,
	`task_snapshot_refetch_total{outcome="error",source="postgres"}`,
	`task_snapshot_refetch_total{outcome="rejected",source="postgres"}`,
	`pushd_singleflight_shared_total`,
	`pushd_writebacks_total`,
	`pushd_notifications_total`,
	`pushd_pubsub_received_total`,
	`pushd_pubsub_malformed_total{reason="json"}`,
	`pushd_pubsub_subscription_losses_total`,
	`pushd_mode_switches_total`,
	`pushd_admission_allowed_total{rule="connect_user"}`,
	`pushd_admission_rejected_total{rule="connect_user"}`,
	`pushd_disconnects_total{reason="slow_client"}`,
	`pushd_connections_open{plan="none",transport="sse"}`,
	`pushd_connections_open{plan="none",transport="websocket"}`,
	`pushd_notification_to_write_seconds_count`,
	`pushd_snapshot_staleness_seconds_count`,
	// The platform's names.
	`rate_limit_allowed_total{endpoint="connect",rule_name="connect_user"}`,
	`rate_limit_rejected_total{endpoint="connect",rule_name="connect_user"}`,
	`rate_limit_retry_after_ms_count{endpoint="connect",rule_name="connect_user"}`,
	`rate_limit_lua_latency_ms_count{endpoint="connect",rule_name="connect_user"}`,
	`cache_hit_total{cache="local"}`,
	`cache_miss_total{cache="local"}`,
	`cache_set_total{cache="local"}`,
	`cache_hit_total{cache="redis"}`,
	`cache_miss_total{cache="redis"}`,
	`cache_set_total{cache="redis"}`,
	`hot_key_detected_total`,
	`pushd_hot_tasks`,
	`pubsub_publish_total`,
	`pushd_notifications_unwatched_total`,
}

// The in-process cache's series: whether a read finds what another read of
// the same task cached a moment before depends on how long that took.
var localCacheSeries = []string{
	`task_snapshot_refetch_total{outcome="miss",source="local_cache"}`,
	`task_snapshot_refetch_total{outcome="hit",source="redis"}`,
	`task_snapshot_refetch_total{outcome="hit",source="local_cache"}`,
	`cache_hit_total{cache="local"}`,
	`cache_miss_total{cache="local"}`,
	`cache_set_total{cache="local"}`,
	`cache_hit_total{cache="redis"}`,
}

// session scrapes a node between the steps of a scripted session.
type session struct {
	t    *testing.T
	base string
	last map[string]float64
}

// step waits until the gate series have moved by their amount (counters
// that move after the client saw the effect: a write is counted once it
// returned), then checks every session series moved by exactly what want
// says (0 when unnamed), except those in vary.
func (s *session) step(name string, want map[string]float64, gate []string, vary ...string) {
	t := s.t
	t.Helper()
	for k := range want {
		if !slices.Contains(sessionSeries, k) {
			t.Fatalf("%s: %s is not a session series", name, k)
		}
	}
	var now map[string]float64
	testenv.Eventually(t, name+": "+strings.Join(gate, ", ")+" moved", func() bool {
		now = testenv.Scrape(t, s.base)
		for _, k := range gate {
			if now[k]-s.last[k] < want[k] {
				return false
			}
		}
		return true
	})
	for _, k := range sessionSeries {
		if slices.Contains(vary, k) {
			continue
		}
		if got := now[k] - s.last[k]; got != want[k] {
			t.Errorf("%s: %s moved by %g, want %g", name, k, got, want[k])
		}
	}
	s.last = now
}

// TestMetricsCountAScriptedSession is the test of record of the node's
// metrics: connects over both transports, a reconnect with a cursor on
// each, a publish through the node, a cache miss answered by PostgreSQL, a
// malformed notification, a task that turns hot, cools and turns hot
// again, a rate-limited connect and a slow client, each followed by a
// scrape that checks every counter moved by exactly its amount.
func TestMetricsCountAScriptedSession(t *testing.T) {
	c := newCluster(t)
	cfg := c.config()
	// Two connects per user, and no refill within the test. The user
	// bucket is the only admission rule on: one Lua round trip per connect.
	cfg.Admission = admission.Config{ConnectUserBurst: 2, ConnectUserRate: 0.001, Timeout: 2 * time.Second}
	// Three connections watching a task by id make it hot.
	cfg.Hub.HotTaskWatchers = 3
	// A client that reads nothing is cut after this; the others read
	// everything they are sent.
	cfg.Hub.WriteTimeout = time.Second
	// Every read is counted: a repair round's reads would fall into a step
	// now and then (the repair's own tests count those).
	srv := startNode(t, cfg, node.ForTest(node.TestTuning{NoRepair: true}))
	s := &session{t: t, base: srv.AdminURL, last: testenv.Scrape(t, srv.AdminURL)}
	if v := s.last[`pushd_mode{mode="push"}`]; v != 1 {
		t.Fatalf(`pushd_mode{mode="push"} = %g, want 1`, v)
	}

	// Published before anyone watches: the node has not subscribed the
	// tenant yet, so it hears nothing.
	taskA, taskD := testenv.UniqueID("task"), testenv.UniqueID("task")
	c.goPublish(t, doc(taskA, "t1", 1, "RUNNING"))
	c.goPublish(t, doc(taskD, "t1", 1, "RUNNING"))

	// 1. Connect: u1 over SSE (the current A is pushed) and WebSocket with
	// since A=1 (nothing to push: a reconnect). Whether the second read of
	// A finds the first's result in the local cache depends on how long
	// the first took, so the reads are counted from step 3 on.
	u1 := token(t, "t1", testenv.UniqueID("user"))
	sse1 := openSSE(t, srv.URL, u1, "task="+taskA)
	if v := sse1.nextTask(t).Version; v != 1 {
		t.Fatalf("SSE got v%d, want v1", v)
	}
	ws1 := openWS(t, srv.URL, u1)
	ws1.send(t, map[string]any{"op": "subscribe", "id": 1, "tasks": []string{taskA}, "since": map[string]int64{taskA: 1}})
	ws1.NextOf(t, "ack")
	s.step("connect", map[string]float64{
		`sse_push_total`: 1,
		`client_reconnect_total{transport="websocket"}`:                                1,
		`pushd_admission_allowed_total{rule="connect_user"}`:                           2,
		`rate_limit_allowed_total{endpoint="connect",rule_name="connect_user"}`:        2,
		`rate_limit_lua_latency_ms_count{endpoint="connect",rule_name="connect_user"}`: 2,
		`pushd_connections_open{plan="none",transport="sse"}`:                          1,
		`pushd_connections_open{plan="none",transport="websocket"}`:                    1,
	}, []string{`sse_push_total`}, localCacheSeries...)

	// 2. Reconnect over SSE: u2 comes back with Last-Event-ID A=1 and
	// also watches D, which it has not seen: only D is pushed, and D's
	// arrival says the initial reads are over. A has its third watcher
	// by id: it is hot.
	u2 := token(t, "t1", testenv.UniqueID("user"))
	sse2 := openSSE(t, srv.URL, u2, "task="+taskA+"&task="+taskD, "Last-Event-ID", taskA+"=1")
	if got := sse2.nextTask(t); got.TaskID != taskD {
		t.Fatalf("the reconnecting client got %s v%d, want only %s", got.TaskID, got.Version, taskD)
	}
	s.step("reconnect", map[string]float64{
		`sse_push_total`: 1,
		`client_reconnect_total{transport="sse"}`:                                      1,
		`pushd_admission_allowed_total{rule="connect_user"}`:                           1,
		`rate_limit_allowed_total{endpoint="connect",rule_name="connect_user"}`:        1,
		`rate_limit_lua_latency_ms_count{endpoint="connect",rule_name="connect_user"}`: 1,
		`pushd_connections_open{plan="none",transport="sse"}`:                          1,
		`hot_key_detected_total`:                                                       1,
		`pushd_hot_tasks`:                                                              1,
	}, []string{`sse_push_total`}, localCacheSeries...)

	// 3. Publish A v2 through the node (POST /v1/publish): the node stores
	// and announces it, then hears it back: one notification, one read (the
	// node's cached v1 is dropped by the notification, so the local cache
	// misses, Redis answers and the snapshot is cached), three writes, each
	// measured by both histograms.
	httpPublish(t, srv.URL, doc(taskA, "t1", 2, "RUNNING"))
	for _, got := range []int64{sse1.nextTask(t).Version, ws1.nextTask(t).Version, sse2.nextTask(t).Version} {
		if got != 2 {
			t.Fatalf("got v%d, want v2", got)
		}
	}
	s.step("publish", map[string]float64{
		`sse_push_total`:              2,
		`websocket_push_total`:        1,
		`pubsub_publish_total`:        1,
		`pushd_pubsub_received_total`: 1,
		`pushd_notifications_total`:   1,
		`task_snapshot_refetch_total{outcome="miss",source="local_cache"}`: 1,
		`task_snapshot_refetch_total{outcome="hit",source="redis"}`:        1,
		`cache_miss_total{cache="local"}`:                                  1,
		`cache_hit_total{cache="redis"}`:                                   1,
		`cache_set_total{cache="local"}`:                                   1,
		`pushd_notification_to_write_seconds_count`:                        3,
		`pushd_snapshot_staleness_seconds_count`:                           3,
	}, []string{`sse_push_total`, `websocket_push_total`, `pushd_notification_to_write_seconds_count`})

	// 4. A cache miss: B is in PostgreSQL only. The WebSocket subscribes to
	// it; the local cache and Redis miss, PostgreSQL answers, the snapshot
	// is cached and written back. An initial state: neither histogram
	// moves.
	taskB := testenv.UniqueID("task")
	c.pg.InsertTask(t, testenv.Task{ID: taskB, TenantID: "t1", ProjectID: "p1", UserID: "u1", Status: "RUNNING", Progress: 10, Version: 5})
	c.redis.Client.Del(t.Context(), c.redis.Names.Snapshot(taskB))
	ws1.send(t, map[string]any{"op": "subscribe", "id": 2, "tasks": []string{taskB}})
	if got := ws1.nextTask(t); got.TaskID != taskB || got.Version != 5 {
		t.Fatalf("got %s v%d, want %s v5", got.TaskID, got.Version, taskB)
	}
	ws1.NextOf(t, "ack")
	s.step("cache miss and PostgreSQL fallback", map[string]float64{
		`websocket_push_total`: 1,
		`task_snapshot_refetch_total{outcome="miss",source="local_cache"}`: 1,
		`task_snapshot_refetch_total{outcome="miss",source="redis"}`:       1,
		`task_snapshot_refetch_total{outcome="hit",source="postgres"}`:     1,
		`cache_miss_total{cache="local"}`:                                  1,
		`cache_miss_total{cache="redis"}`:                                  1,
		`cache_set_total{cache="local"}`:                                   1,
		`cache_set_total{cache="redis"}`:                                   1,
		`pushd_writebacks_total`:                                           1,
	}, []string{`websocket_push_total`})
	if n, err := c.redis.Client.Exists(t.Context(), c.redis.Names.Snapshot(taskB)).Result(); err != nil || n != 1 {
		t.Fatalf("B not written back to Redis: %d %v", n, err)
	}

	// 5. A malformed notification is heard and dropped, by reason.
	c.tssPublish(t, "t1", `{"task_id":`)
	s.step("malformed notification", map[string]float64{
		`pushd_pubsub_received_total`:                 1,
		`pushd_pubsub_malformed_total{reason="json"}`: 1,
	}, []string{`pushd_pubsub_malformed_total{reason="json"}`})

	// 6. A hot task cools: the WebSocket stops watching A, which two
	// connections watch now. Unsubscribing is acked once it is done.
	ws1.send(t, map[string]any{"op": "unsubscribe", "id": 3, "tasks": []string{taskA}})
	ws1.NextOf(t, "ack")
	s.step("hot task cools", map[string]float64{
		`pushd_hot_tasks`: -1,
	}, nil)

	// 7. And turns hot again when the WebSocket watches it once more, from
	// the version it has: counted a second time, nothing pushed. The read
	// that checks A's version is the local cache's or Redis's.
	ws1.send(t, map[string]any{"op": "subscribe", "id": 4, "tasks": []string{taskA}, "since": map[string]int64{taskA: 2}})
	ws1.NextOf(t, "ack")
	s.step("hot task again", map[string]float64{
		`hot_key_detected_total`: 1,
		`pushd_hot_tasks`:        1,
	}, nil, localCacheSeries...)

	// 8. A rate-limited connect: u1's third within the bucket. Refused by
	// the user's bucket after one round trip, with the wait it asks for.
	st, h, body, _ := sseStatus(t, srv.URL, u1)
	want429(t, st, h, body, "rate_limit_exceeded", time.Hour)
	s.step("rate-limited connect", map[string]float64{
		`pushd_admission_rejected_total{rule="connect_user"}`:                          1,
		`rate_limit_rejected_total{endpoint="connect",rule_name="connect_user"}`:       1,
		`rate_limit_retry_after_ms_count{endpoint="connect",rule_name="connect_user"}`: 1,
		`rate_limit_lua_latency_ms_count{endpoint="connect",rule_name="connect_user"}`: 1,
	}, nil)

	// 9. A slow client: u3 watches 40 tasks over a socket it never reads,
	// with a small receive buffer, while far more than socket buffers
	// hold is published to them. Its write times out and it is cut. How
	// many of its writes went through first is the kernel's business, so
	// the writes and their reads are not counted here.
	const tasks, rounds = 40, 4
	ids := make([]string, tasks)
	query := make([]string, tasks)
	for i := range ids {
		ids[i] = testenv.UniqueID("task")
		query[i] = "task=" + ids[i]
		c.goPublish(t, doc(ids[i], "t1", 1, "RUNNING"))
	}
	// A publish returns before the node hears its hint: the v1 hints must
	// be heard before anyone watches the tasks, or they count as watched.
	testenv.Eventually(t, "the v1 hints heard", func() bool {
		return testenv.Scrape(t, s.base)[`pushd_notifications_total`]-s.last[`pushd_notifications_total`] >= tasks
	})
	stalledSSE(t, srv.URL, token(t, "t1", testenv.UniqueID("user")), query)
	pad := strings.Repeat("x", 60<<10)
	for v := int64(2); v <= rounds+1; v++ {
		for _, id := range ids {
			c.goPublish(t, strings.Replace(doc(id, "t1", v, "RUNNING"), `"x_custom"`, `"pad":"`+pad+`","x_custom"`, 1))
		}
	}
	beforeSlow := s.last
	// The cut counts its disconnect before the connection leaves the open
	// gauge: wait for both, so the step reads the connection gone.
	open := `pushd_connections_open{plan="none",transport="sse"}`
	testenv.Eventually(t, "slow client cut and gone", func() bool {
		now := testenv.Scrape(t, s.base)
		return now[`pushd_disconnects_total{reason="slow_client"}`] > s.last[`pushd_disconnects_total{reason="slow_client"}`] && now[open] == s.last[open]
	})
	s.step("slow client", map[string]float64{
		`pushd_disconnects_total{reason="slow_client"}`:                                1,
		`pushd_admission_allowed_total{rule="connect_user"}`:                           1,
		`rate_limit_allowed_total{endpoint="connect",rule_name="connect_user"}`:        1,
		`rate_limit_lua_latency_ms_count{endpoint="connect",rule_name="connect_user"}`: 1,
		`pushd_pubsub_received_total`:                                                  tasks * (rounds + 1), // v1 of each, heard while nobody watches them yet, then the rounds
		`pushd_notifications_total`:                                                    tasks * (rounds + 1),
	}, []string{`pushd_disconnects_total{reason="slow_client"}`, `pushd_pubsub_received_total`},
		append([]string{`sse_push_total`, `pushd_notification_to_write_seconds_count`, `pushd_snapshot_staleness_seconds_count`,
			`pushd_singleflight_shared_total`,
			// The v1 of each is heard before the client watches them, and
			// the rounds after it was cut are watched by nobody.
			`pushd_notifications_unwatched_total`}, localCacheSeries...)...)
	if got := s.last[`pushd_notifications_unwatched_total`] - beforeSlow[`pushd_notifications_unwatched_total`]; got < tasks {
		t.Errorf("slow client: pushd_notifications_unwatched_total moved by %g, want at least the %d heard before anyone watched", got, tasks)
	}

	// The three well-behaved connections are still counted, and the node
	// stayed in push mode throughout.
	for k, want := range map[string]float64{
		`pushd_connections_open{plan="none",transport="sse"}`:       2,
		`pushd_connections_open{plan="none",transport="websocket"}`: 1,
		`pushd_mode{mode="push"}`:                                   1,
		`pushd_hot_tasks`:                                           1,
	} {
		if got := s.last[k]; got != want {
			t.Errorf("%s = %g, want %g", k, got, want)
		}
	}
}

// With streams, stream_length (and pushd_stream_length_entries) is the
// length of the tailed streams as their tail found it: five entries of a
// tenant nobody watched yet, read when a client watches one of its tasks.
// An entry appended after that is read, delivered and measured once.
func TestMetricsStreamLength(t *testing.T) {
	c := newCluster(t)
	srv := startNode(t, c.streamConfig())
	tenant, task := testenv.UniqueID("tenant"), testenv.UniqueID("task")
	const entries = 5
	for v := int64(1); v <= entries; v++ {
		streamPublish(t, c.redis.Client, c.redis.Names, tenantDoc(task, tenant, v))
	}
	before := testenv.Scrape(t, srv.AdminURL)
	for _, k := range []string{`stream_length{stat="sum"}`, `stream_length{stat="max"}`, `pushd_streams_tailed`} {
		if v := before[k]; v != 0 {
			t.Fatalf("%s = %g before anyone watches, want 0", k, v)
		}
	}
	sse := openSSE(t, srv.URL, token(t, tenant, testenv.UniqueID("user")), "task="+task)
	// A sync may come after the first task event and before the next: it
	// ends the initial state once the node knows the stream's position,
	// which on a busy machine can be after that event was written.
	if v := parseDoc(t, nextTaskEvent(t, sse).Data).Version; v != entries {
		t.Fatalf("got v%d, want v%d", v, entries)
	}
	var now map[string]float64
	testenv.Eventually(t, "the tenant's stream tailed", func() bool {
		now = testenv.Scrape(t, srv.AdminURL)
		return now[`pushd_streams_tailed`] == 1 && now[`stream_length{stat="sum"}`] > 0
	})
	for k, want := range map[string]float64{
		`stream_length{stat="sum"}`:               entries,
		`stream_length{stat="max"}`:               entries,
		`pushd_stream_length_entries{stat="sum"}`: entries,
		`pushd_stream_length_entries{stat="max"}`: entries,
	} {
		if got := now[k]; got != want {
			t.Errorf("%s = %g, want %g", k, got, want)
		}
	}

	streamPublish(t, c.redis.Client, c.redis.Names, tenantDoc(task, tenant, entries+1))
	if v := parseDoc(t, nextTaskEvent(t, sse).Data).Version; v != entries+1 {
		t.Fatalf("got v%d, want v%d", v, entries+1)
	}
	testenv.Eventually(t, "the new entry read from the stream", func() bool {
		now = testenv.Scrape(t, srv.AdminURL)
		return now[`pushd_stream_entries_total`]-before[`pushd_stream_entries_total`] >= 1
	})
	for k, want := range map[string]float64{
		`pushd_stream_entries_total`:      1,
		`pushd_stream_lag_seconds_count`:  1,
		`pushd_stream_apply_errors_total`: 0,
	} {
		if got := now[k] - before[k]; got != want {
			t.Errorf("%s moved by %g, want %g", k, got, want)
		}
	}
}

// Each Redis client's pool is measured under the roles it serves: one
// client for every role on one URL, and a client of its own for a role
// given its own URL.
func TestMetricsRedisPools(t *testing.T) {
	c := newCluster(t)
	for _, split := range []bool{false, true} {
		cfg := c.config()
		clients := []string{"cache+control+realtime"}
		if split {
			cfg.RedisControlURL = cfg.RedisURL + "?client_name=control"
			clients = []string{"cache+realtime", "control"}
		}
		srv := startNode(t, cfg)
		tenant := testenv.UniqueID("tenant")
		sse := openSSE(t, srv.URL, token(t, tenant, testenv.UniqueID("user")), "task="+testenv.UniqueID("task"))
		if ev := sse.Next(t); ev.Event != "hello" {
			t.Fatalf("split %v: first event %q", split, ev.Event)
		}
		sse.NextOf(t, "error") // not_found: the initial read has run
		m := testenv.Scrape(t, srv.AdminURL)
		for _, client := range clients {
			for _, k := range []string{
				`pushd_redis_pool_waits_total{client="` + client + `",pool="main"}`,
				`pushd_redis_pool_wait_seconds_total{client="` + client + `",pool="main"}`,
				`pushd_redis_pool_timeouts_total{client="` + client + `",pool="pipeline"}`,
			} {
				if _, ok := m[k]; !ok {
					t.Errorf("split %v: no %s", split, k)
				}
			}
		}
		// The subscribe's read (an MGET of the snapshot and its "not
		// found" marker) ran on the cache role's client.
		if k := `pushd_redis_pool_connections{client="` + clients[0] + `",pool="main",state="open"}`; m[k] < 1 {
			t.Errorf("split %v: %s = %g, want at least 1: the client read the task", split, k, m[k])
		}
		for k := range m {
			if strings.HasPrefix(k, "pushd_redis_pool_connections{") && !slices.ContainsFunc(clients, func(c string) bool { return strings.Contains(k, `client="`+c+`"`) }) {
				t.Errorf("split %v: unexpected %s", split, k)
			}
		}
	}
}

// Without pool_max_conns in its URL, a node's PostgreSQL pool holds a
// connection for each fallback read and session lookup it may run at once
// (pgxpool's own default, the greater of 4 and the CPUs, would queue them);
// the URL's own setting wins.
func TestPostgresPoolFitsTheQueries(t *testing.T) {
	c := newCluster(t)
	for _, tc := range []struct {
		param string
		want  float64
	}{{"", 12}, {"pool_max_conns=3", 3}} {
		cfg := c.config()
		if tc.param != "" {
			sep := "?"
			if strings.Contains(cfg.DatabaseURL, "?") {
				sep = "&"
			}
			cfg.DatabaseURL += sep + tc.param
		}
		srv := startNode(t, cfg)
		m := testenv.Scrape(t, srv.AdminURL)
		if got := m[`pushd_postgres_pool_connections{state="max"}`]; got != tc.want {
			t.Errorf("%q: the pool holds at most %g connections, want %g", tc.param, got, tc.want)
		}
		for _, k := range []string{`pushd_postgres_pool_waits_total`, `pushd_postgres_pool_wait_seconds_total`, `pushd_postgres_pool_connections{state="open"}`} {
			if _, ok := m[k]; !ok {
				t.Errorf("%q: no %s", tc.param, k)
			}
		}
	}
}
