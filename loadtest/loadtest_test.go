package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// TestMain is also the worker: the controller re-executes the test binary,
// which cannot take a -worker flag of its own, with PUSHD_LOADTEST_WORKER=1.
func TestMain(m *testing.M) {
	if os.Getenv(workerEnv) == "1" {
		os.Exit(workerMain(os.Stdin, os.Stdout))
	}
	code := m.Run()
	if serverDir != "" {
		os.RemoveAll(serverDir)
	}
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goroutines left behind:", err)
			code = 1
		}
	}
	os.Exit(code)
}

var (
	serverOnce   sync.Once
	serverBin    string
	serverCommit string
	serverErr    error
	serverDir    string
)

// pushdBinary builds pushd from the working tree once per test binary,
// without -race: the server is what runs fast here, the loadtest is what is
// tested.
func pushdBinary(t *testing.T) (bin, commit string) {
	t.Helper()
	serverOnce.Do(func() {
		serverDir, serverErr = os.MkdirTemp("", "pushd-loadtest-test-")
		if serverErr != nil {
			return
		}
		cfg := config{Repo: "..", ServerSrc: "worktree"}
		serverBin, serverCommit, serverErr = buildServer(context.Background(), cfg, serverDir)
	})
	if serverErr != nil {
		t.Fatal(serverErr)
	}
	return serverBin, serverCommit
}

func env(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// tinyConfig is a scenario at test scale: 50 connections, one worker, 2 s.
func tinyConfig(scenario, transport string) config {
	return config{
		Scenario: scenario, Transport: transport,
		Conns: 50, Tasks: 10, Tenants: 3, Rate: 50, Duration: 2 * time.Second, ChurnRate: 20, Outage: time.Second,
		Settle: 10 * time.Second, Workers: 1, PerWorker: 5000, Ramp: 1000, Sources: 4, Publishers: 4, PGWrites: "auto",
		DatabaseURL: env("PUSHD_TEST_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"),
		RedisServer: "redis-server",
		ServerArgs:  []string{"--poll-interval", "200ms", "--drain-timeout", "1s"},
		Command:     "go test ./loadtest/",
	}.withDefaults()
}

// logWriter sends a run's progress lines to the test log.
type logWriter struct{ t *testing.T }

func (w logWriter) Write(p []byte) (int, error) {
	w.t.Helper()
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

func runTiny(t *testing.T, cfg config) *result {
	t.Helper()
	bin, commit := pushdBinary(t)
	if cfg.Scenario == "idle" {
		cfg.Tasks = cfg.Conns
	}
	timeout := time.Minute
	if cfg.Scenario == "stall" {
		timeout = 3 * time.Minute // two phases, each waiting up to 15 s for convergence
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	res, err := runOne(ctx, cfg, bin, commit, t.TempDir(), logWriter{t})
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	res.report(&buf)
	t.Log(buf.String())
	t.Log(res.row())
	// Every scenario: every live connection holds its task's last version
	// and none saw a version go backwards.
	c := res.Convergence
	if c == nil {
		t.Fatal("no convergence report")
	}
	if c.Regressions != 0 {
		t.Errorf("%d regressions: %v", c.Regressions, c.RegressionEx)
	}
	if c.Live != cfg.Conns || c.Converged != c.Live {
		t.Errorf("converged %d of %d live connections (want %d): %v", c.Converged, c.Live, cfg.Conns, c.NotConverged)
	}
	if !res.OK {
		t.Errorf("run failed: %v", res.Problems)
	}
	if len(res.Samples) == 0 || res.Samples[len(res.Samples)-1].RSSKB == 0 {
		t.Error("no samples of the server")
	}
	// Once every client is gone the server is back to what it held before
	// anyone connected (disconnectAll waited for it, with a deadline).
	base, after := figureOf(t, res, "goroutines_baseline"), figureOf(t, res, "goroutines_after_disconnect")
	if slack := goroutineSlack * res.Nodes; base <= 0 || after > base+float64(slack) {
		t.Errorf("server goroutines %v after every client disconnected, want at most the %v before anyone connected + %d", after, base, slack)
	}
	if n := figureOf(t, res, "connections_after_disconnect"); n != 0 {
		t.Errorf("the server holds %v connections after every client disconnected", n)
	}
	return res
}

func figureOf(t *testing.T, res *result, name string) float64 {
	t.Helper()
	v, ok := lookupFigure(res, name)
	if !ok {
		t.Fatalf("no figure %q in %+v", name, res.Figures)
	}
	return v
}

func lookupFigure(res *result, name string) (float64, bool) {
	for _, f := range res.Figures {
		if f.Name == name {
			return f.Value, true
		}
	}
	return 0, false
}

func TestScenarios(t *testing.T) {
	for _, transport := range []string{"sse", "ws"} {
		t.Run(transport, func(t *testing.T) {
			t.Parallel()
			t.Run("idle", func(t *testing.T) {
				res := runTiny(t, tinyConfig("idle", transport))
				if g := figureOf(t, res, "goroutines_after"); g <= 0 {
					t.Errorf("goroutines after connecting: %v", g)
				}
				figureOf(t, res, "rss_per_conn_kb")
			})
			t.Run("fanout", func(t *testing.T) {
				res := runTiny(t, tinyConfig("fanout", transport))
				// 50 updates/s over 10 tasks watched by 5 connections each.
				if d := figureOf(t, res, "deliveries_per_s"); d < 100 {
					t.Errorf("%v deliveries/s, want about 250", d)
				}
				if l := res.Latencies["delivery"]; l == nil || l.Count == 0 {
					t.Errorf("no delivery latencies: %+v", l)
				}
			})
			t.Run("churn", func(t *testing.T) {
				res := runTiny(t, tinyConfig("churn", transport))
				if n := figureOf(t, res, "churned_per_s"); n <= 0 {
					t.Errorf("churned %v/s", n)
				}
				if l := res.Latencies["connect"]; l == nil || l.Count == 0 {
					t.Errorf("no connect latencies: %+v", l)
				}
			})
			t.Run("storm", func(t *testing.T) {
				res := runTiny(t, tinyConfig("storm", transport))
				figureOf(t, res, "converge_s")
				if q := figureOf(t, res, "pg_queries"); q == 0 {
					t.Error("the restarted server read nothing from PostgreSQL: Redis was not cold")
				}
				if res.Convergence.Reconnects < int64(res.Conns) {
					t.Errorf("%d reconnects for %d clients", res.Convergence.Reconnects, res.Conns)
				}
			})
			t.Run("storm-resume", func(t *testing.T) {
				cfg := tinyConfig("storm", transport)
				cfg.Conns, cfg.Tasks, cfg.StormResume, cfg.RepairInterval = 200, 20, true, time.Second
				cfg = cfg.withDefaults()
				res := runTiny(t, cfg)
				figureOf(t, res, "converge_s")
				if n := figureOf(t, res, "reconnected"); n != float64(cfg.Conns) {
					t.Errorf("%v of %d clients reconnected", n, cfg.Conns)
				}
				// Every client of a moved task is sent it; what else is sent
				// (resent_unchanged) is what the run measures, not checked here.
				ideal := figureOf(t, res, "events_per_client_ideal")
				if ideal <= 0 || figureOf(t, res, "events_per_client_after_resume") < ideal {
					t.Errorf("%v events per client after resume, want at least the %v of the moved tasks", figureOf(t, res, "events_per_client_after_resume"), ideal)
				}
				figureOf(t, res, "resent_unchanged")
				figureOf(t, res, "repairs_quiet_window")
				if n := figureOf(t, res, "stream_resumes"); transport == "sse" && n == 0 {
					t.Error("no SSE client resumed from a stream cursor")
				}
			})
			t.Run("outage", func(t *testing.T) {
				res := runTiny(t, tinyConfig("outage", transport))
				// The promise the node's failure tests hold it to as well.
				if s := figureOf(t, res, "to_polling_s"); s > 3 {
					t.Errorf("the server reported polling %.3f s after Redis was killed, want within 3 s", s)
				}
				figureOf(t, res, "catch_up_s")
				if res.Publisher.PGWrites == 0 {
					t.Error("the publisher wrote no PostgreSQL row while Redis was down")
				}
			})
			t.Run("repair", func(t *testing.T) {
				cfg := tinyConfig("repair", transport)
				cfg.Tasks, cfg.RepairInterval = cfg.Conns, 500*time.Millisecond
				res := runTiny(t, cfg)
				// Two seconds of 0.5 s rounds; quiet tasks need no repair.
				if n := figureOf(t, res, "repair_rounds"); n < 2 {
					t.Errorf("%v repair rounds in %v, want about 4", n, cfg.Duration)
				}
				if rows := figureOf(t, res, "db_rows_per_task_per_min"); rows <= 0 {
					t.Error("the repair rounds read no versions from PostgreSQL")
				}
				if n := figureOf(t, res, "repairs"); n != 0 {
					t.Errorf("%v repairs of tasks nobody changed", n)
				}
				figureOf(t, res, "redis_cmds_per_round")
			})
		})
	}
}

// TestCluster runs fanout, storm and fanout with a master killed on three
// nodes over a private Redis Cluster, at the size of the other scenarios'
// tests. Clients spread over the nodes; the master kill must be followed
// by the replica's promotion and by deliveries to every connection, the
// dead shard's tenants' included (runTiny checks convergence).
func TestCluster(t *testing.T) {
	cluster := func(scenario string) config {
		cfg := tinyConfig(scenario, "sse")
		cfg.Cluster = true
		return cfg
	}
	t.Run("fanout", func(t *testing.T) {
		res := runTiny(t, cluster("fanout"))
		if !res.Cluster || res.Nodes != 3 || !strings.Contains(res.row(), "cluster") {
			t.Errorf("the result does not say cluster mode: cluster %v, %d nodes, row %s", res.Cluster, res.Nodes, res.row())
		}
		if res.CPU == nil || len(res.CPU.ServerPerNode) != 3 {
			t.Errorf("server CPU per node: %+v", res.CPU)
		}
		// Clients go round-robin over the nodes: 17, 17 and 16 of 50.
		if n := res.NodeConnections; len(n) != 3 || n[0] != 17 || n[1] != 17 || n[2] != 16 {
			t.Errorf("connections per node %v, want [17 17 16]", n)
		}
		if d := figureOf(t, res, "deliveries_per_s"); d < 100 {
			t.Errorf("%v deliveries/s, want about 250", d)
		}
		// Every node watches the tenant: each hears each hint once, and
		// reads its snapshot at most once (a hint still in flight at the
		// end is heard after the count).
		if m := figureOf(t, res, "pubsub_msgs_per_update"); m < 2.5 || m > 3.05 {
			t.Errorf("%v Pub/Sub messages heard per update on 3 nodes, want 3", m)
		}
		if rd := figureOf(t, res, "node_redis_reads_per_update"); rd > 3.05 {
			t.Errorf("%v Redis reads per update on 3 nodes, want at most one a node", rd)
		}
		figureOf(t, res, "redis_cmds_per_update")
		if c := figureOf(t, res, "redis_conns_per_node_max"); c < 1 {
			t.Errorf("%v Redis connections on the busiest node, want at least its Pub/Sub's", c)
		}
	})
	t.Run("storm", func(t *testing.T) {
		res := runTiny(t, cluster("storm"))
		figureOf(t, res, "converge_s")
		if q := figureOf(t, res, "pg_queries"); q == 0 {
			t.Error("the restarted nodes read nothing from PostgreSQL: Redis was not cold")
		}
		if res.Convergence.Reconnects < int64(res.Conns) {
			t.Errorf("%d reconnects for %d clients", res.Convergence.Reconnects, res.Conns)
		}
	})
	t.Run("kill-master", func(t *testing.T) {
		cfg := cluster("fanout")
		cfg.KillMaster = true
		res := runTiny(t, cfg)
		figureOf(t, res, "failover_s")
		k := res.KilledMaster
		if k == nil || len(k.Tenants) == 0 || len(k.Groups) != 3 {
			t.Fatalf("killed master report: %+v", k)
		}
		for _, g := range k.Groups {
			if g.Resumed != g.Conns {
				t.Errorf("%s: %d of %d connections received a snapshot published after the kill", g.Name, g.Resumed, g.Conns)
			}
		}
		if k.Groups[groupShard].Conns == 0 {
			t.Error("no connection watched a tenant of the killed master")
		}
		if res.Publisher.RedisErrors == 0 {
			t.Error("no write failed: the master was not killed")
		}
	})
}

// TestFleetIdle runs idle on three nodes with the production limits, for
// each transport: every node holds some of the 300 connections, and every
// part's cost per connection is reported, node by node for the server.
// The transports run one after the other: the kernel's figures are the
// whole machine's.
func TestFleetIdle(t *testing.T) {
	for _, transport := range []string{"sse", "ws"} {
		t.Run(transport, func(t *testing.T) {
			cfg := tinyConfig("idle", transport)
			cfg.Conns, cfg.Nodes, cfg.Limits = 300, 3, "production"
			cfg = cfg.withDefaults()
			res := runTiny(t, cfg)
			if res.Nodes != 3 || res.Limits != "production" || !strings.Contains(res.row(), "3 nodes") {
				t.Errorf("the result does not say 3 nodes with production limits: %d nodes, limits %q, row %s", res.Nodes, res.Limits, res.row())
			}
			for _, name := range []string{"rss_per_conn_kb", "server_rss_per_conn_kb_min", "server_rss_per_conn_kb_max",
				"loadgen_rss_per_conn_kb", "redis_mem_per_conn_bytes", "redis_conn_keys_per_conn_bytes", "connect_all_s"} {
				if v := figureOf(t, res, name); v <= 0 {
					t.Errorf("%s = %v, want above 0", name, v)
				}
			}
			// The kernel's is the machine's: the tests of other packages,
			// opening and closing sockets meanwhile, move it more than 600
			// sockets do. Reported, not bounded here.
			figureOf(t, res, "kernel_per_conn_kb")
			figureOf(t, res, "kernel_sockbuf_per_conn_kb")
			figureOf(t, res, "kernel_slab_per_conn_kb")
			figureOf(t, res, "loadgen_rss_delta_per_conn_kb")
			// On Linux no connection holds a goroutine while it is open or
			// waits: once every one holds its stream the dialers have left
			// (they run only while attempts are queued), and the worker keeps
			// its command loop and the poller's loop. 0.1 at 300 connections
			// is 30 goroutines: ten times those few, far below the 1.0 of a
			// goroutine per connection.
			if g := figureOf(t, res, "loadgen_goroutines_per_conn"); runtime.GOOS == "linux" && g > 0.1 {
				t.Errorf("the load generator holds %v goroutines per connection, want at most 0.1", g)
			}
			figureOf(t, res, "redis_task_keys_change_mb")
			if lo, hi := figureOf(t, res, "server_rss_per_conn_kb_min"), figureOf(t, res, "server_rss_per_conn_kb_max"); lo > hi {
				t.Errorf("server RSS per connection: min %v above max %v", lo, hi)
			}
			for _, key := range []string{"connections", "server_rss_per_conn_kb", "goroutines_per_conn"} {
				if v := res.PerNode[key]; len(v) != 3 {
					t.Errorf("per_node[%s] = %v, want one value per node", key, v)
				}
			}
			// Clients go round-robin over the nodes: 100 each.
			for i, n := range res.PerNode["connections"] {
				if n <= 0 {
					t.Errorf("node %d held %v connections", i, n)
				}
			}
			if n := res.NodeConnections; len(n) != 3 || n[0] != 100 || n[1] != 100 || n[2] != 100 {
				t.Errorf("connections per node at the end %v, want [100 100 100]", n)
			}
			// Production limits take a lease per connection, and refuse none.
			if l := res.ServerMetrics["pushd_admission_leases"]; l != float64(cfg.Conns) {
				t.Errorf("%v leases held at the end, want one per connection, %d", l, cfg.Conns)
			}
			if n := figureOf(t, res, "admission_rejected"); n != 0 {
				t.Errorf("a production limit refused %v admission checks: %v", n, res.Warnings)
			}
			figureOf(t, res, "admission_fallbacks")
			// The fleet's shared parts at idle: reported, and each node
			// holds a Redis connection at least (its Pub/Sub's).
			for _, name := range []string{"pg_queries_per_node_per_min", "redis_cmds_per_node_per_min_idle", "node_idle_cpu_pct", "pg_conns_per_node_max"} {
				figureOf(t, res, name)
			}
			if c := figureOf(t, res, "redis_conns_per_node_max"); c < 1 {
				t.Errorf("%v Redis connections on the busiest node, want at least its Pub/Sub's", c)
			}
		})
	}
}

// TestFleetFlags: -nodes runs the scenarios several nodes can, alone or on
// the cluster; -limits production runs idle and fanout on pushd, with at
// most pushd's per-tenant cap on one tenant.
func TestFleetFlags(t *testing.T) {
	for _, args := range [][]string{
		{"-nodes", "0", "-scenario", "idle"},
		{"-nodes", "2", "-scenario", "stall"},
		{"-nodes", "2", "-scenario", "outage"},
		{"-nodes", "2", "-scenario", "storm", "-storm-resume"},
		{"-nodes", "2", "-scenario", "idle", "-target", "centrifugo", "-centrifugo-bin", "x"},
		{"-cluster", "-nodes", "5", "-scenario", "churn"},
		{"-limits", "lax", "-scenario", "idle"},
		{"-limits", "production", "-scenario", "storm"},
		{"-limits", "production", "-quick"},
		{"-limits", "production", "-scenario", "idle", "-conns", "200000"},
		{"-hold", "10s", "-scenario", "fanout"},
		{"-redis-nice", "-10", "-cluster", "-scenario", "idle"},
		{"-redis-nice", "-21", "-scenario", "idle"},
		{"-latency-from", "publish", "-scenario", "fanout"},
		{"-pg-writes", "only", "-scenario", "idle"},
		{"-pg-writes", "only", "-scenario", "fanout", "-target", "both", "-centrifugo-bin", "x"},
	} {
		if _, err := parseFlags(args, io.Discard); err == nil {
			t.Errorf("%v: accepted", args)
		}
	}
	for _, tc := range []struct {
		args  []string
		nodes int
	}{
		{[]string{"-scenario", "idle"}, 1},
		{[]string{"-scenario", "fanout", "-cluster"}, 3},
		{[]string{"-scenario", "idle", "-cluster", "-nodes", "5"}, 5},
		{[]string{"-scenario", "storm", "-nodes", "4"}, 4},
		{[]string{"-scenario", "idle", "-nodes", "8", "-limits", "production", "-conns", "200000", "-tenants", "20"}, 8},
		{[]string{"-scenario", "fanout", "-pg-writes", "only", "-nodes", "2"}, 2},
	} {
		cfg, err := parseFlags(tc.args, io.Discard)
		if err != nil {
			t.Errorf("%v: %v", tc.args, err)
			continue
		}
		if runs := cfg.runs(); len(runs) != 1 || runs[0].nodeCount() != tc.nodes {
			t.Errorf("%v: runs %d nodes, want %d", tc.args, runs[0].nodeCount(), tc.nodes)
		}
	}
	cfg, err := parseFlags([]string{"-quick", "-nodes", "2"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range cfg.runs() {
		if !slices.Contains(multiNodeScenarios, c.Scenario) {
			t.Errorf("-quick -nodes 2 runs %s", c.Scenario)
		}
	}
	// 16 sources and a ramp of 2,000/s: 125 connects a second from each.
	c := config{Conns: 80000, Sources: 16, Ramp: 2000}
	if perIP, rate, burst := c.addressLimits(); perIP != 6250 || rate != 250 || burst != 250 {
		t.Errorf("address limits for 80,000 connections from 16 sources: %d streams, %d/s, burst %d; want 6250, 250, 250", perIP, rate, burst)
	}
}

// TestStall runs the stall scenario small: 20 healthy clients, half SSE and
// half WebSocket, alone and then beside 16 + 16 stalled clients watching
// every task with 30 KB snapshots. As many stalled clients as the node has
// writers (32, the hub's default, which no setting changes) are enough to
// hold every writer if a stalled client can. The report must have each
// phase's latency by transport and convergence, the stalled clients, and
// every healthy client must hold its last version within 2 s of the last
// publish in both phases (runTiny fails a run whose report says otherwise).
func TestStall(t *testing.T) {
	cfg := tinyConfig("stall", "")
	cfg.Conns, cfg.Tasks, cfg.Tenants, cfg.Rate, cfg.Duration = 20, 10, 1, 100, 3*time.Second
	cfg.StalledSSE, cfg.StalledWS = 16, 16
	res := runTiny(t, cfg)
	if res.Transport != "sse+ws" || res.StalledSSE != 16 || res.StalledWS != 16 || res.SnapBytes != 30000 {
		t.Errorf("run settings: transport %q, stalled %d + %d, snapshots of %d bytes", res.Transport, res.StalledSSE, res.StalledWS, res.SnapBytes)
	}
	for _, phase := range []string{"alone", "beside"} {
		for _, tr := range []string{"sse", "ws"} {
			if l := res.Latencies[phase+"_"+tr]; l == nil || l.Count == 0 || l.P99 < l.P50 || l.Max < l.P99 {
				t.Errorf("%s %s latency: %+v", phase, tr, l)
			}
		}
		if n := figureOf(t, res, phase+"_healthy"); n != 20 {
			t.Errorf("%s: %v healthy clients, want 20", phase, n)
		}
		for _, within := range []string{"2s", "15s"} {
			if n := figureOf(t, res, phase+"_not_converged_"+within); n != 0 {
				t.Errorf("%s: %v healthy clients without their last version within %s of the last publish", phase, n, within)
			}
		}
		if s, ok := lookupFigure(res, phase+"_converge_s"); !ok || s > 2 {
			t.Errorf("%s: converged %.2f s after the last publish (reported: %v), want within 2 s", phase, s, ok)
		}
	}
	for _, tr := range []string{"sse", "ws"} {
		if n := figureOf(t, res, "stalled_"+tr); n != 16 {
			t.Errorf("%v stalled %s clients connected, want 16", n, tr)
		}
		if n := figureOf(t, res, "stalled_"+tr+"_cut"); n < 0 || n > 16 {
			t.Errorf("%v stalled %s clients cut of 16", n, tr)
		}
		figureOf(t, res, "p99_beside_over_alone_"+tr)
	}
}

// TestReadSSE parses a stream with every field the loadtest reads, a
// multi-line data field and a line longer than the reader's buffer.
func TestReadSSE(t *testing.T) {
	w := &worker{errs: map[string]int64{}, modeSeen: map[string]*modeSeen{}}
	w.setPhase("p")
	c := &conn{w: w, task: 3}
	long := strings.Repeat("x", 9000)
	stream := "retry: 2000\n" +
		"event: hello\ndata: {\"conn_id\":\"c1\"}\n\n" +
		": hb\n\n" +
		"event: task\r\nid: lt_3=4\r\ndata: {\"task_id\":\"lt_3\",\"version\":4,\r\ndata: \"sent_ns\":1,\"pad\":\"" + long + "\"}\r\n\r\n" +
		"event: mode\ndata: {\"mode\":\"polling\",\"reason\":\"pubsub_down\"}\n\n" +
		"event: task\nid: lt_3=3\ndata: {\"task_id\":\"lt_3\",\"version\":3,\"sent_ns\":1}\n\n" +
		"event: error\ndata: {\"code\":\"not_found\",\"task_id\":\"lt_9\"}\n\n"
	err := c.readSSE(bufio.NewReaderSize(strings.NewReader(stream), 4096))
	if err == nil || !strings.Contains(err.Error(), "EOF") {
		t.Fatalf("readSSE: %v, want EOF", err)
	}
	if got := c.last.Load(); got != 4 {
		t.Errorf("last version %d, want 4", got)
	}
	if string(c.cursor) != "lt_3=3" {
		t.Errorf("cursor %q", c.cursor)
	}
	if n := w.regressions.Load(); n != 1 {
		t.Errorf("%d regressions, want 1 (version 3 after 4)", n)
	}
	if w.errs["error_event_not_found"] != 1 || w.modeSeen["polling"] == nil {
		t.Errorf("errors %v, modes %v", w.errs, w.modeSeen)
	}
}

// TestClusterFlags: -cluster runs fanout and storm only, -kill-master
// needs -cluster and fanout, and -cluster -quick runs fanout, storm and the
// master kill for each transport.
func TestClusterFlags(t *testing.T) {
	for _, args := range [][]string{
		{"-cluster", "-scenario", "outage"},
		{"-kill-master", "-scenario", "fanout"},
		{"-cluster", "-kill-master", "-scenario", "storm"},
	} {
		if _, err := parseFlags(args, io.Discard); err == nil {
			t.Errorf("%v: accepted", args)
		}
	}
	cfg, err := parseFlags([]string{"-cluster", "-quick"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, c := range cfg.runs() {
		got = append(got, fmt.Sprintf("%s/%s/%v/%v", c.Scenario, c.Transport, c.Cluster, c.KillMaster))
	}
	want := []string{"fanout/sse/true/false", "fanout/ws/true/false", "storm/sse/true/false", "storm/ws/true/false", "fanout/sse/true/true", "fanout/ws/true/true"}
	if !slices.Equal(got, want) {
		t.Errorf("-cluster -quick runs %v, want %v", got, want)
	}
}

// TestStormResumeFlags: -storm-resume is a storm on one node, and
// -storm-moved a share that goes with it.
func TestStormResumeFlags(t *testing.T) {
	for _, args := range [][]string{
		{"-storm-resume", "-scenario", "fanout"},
		{"-storm-resume", "-quick"},
		{"-storm-resume", "-cluster", "-scenario", "storm"},
		{"-storm-moved", "0.2", "-scenario", "storm"},
		{"-storm-resume", "-storm-moved", "0", "-scenario", "storm"},
		{"-storm-resume", "-storm-moved", "1.5", "-scenario", "storm"},
	} {
		if _, err := parseFlags(args, io.Discard); err == nil {
			t.Errorf("%v: accepted", args)
		}
	}
	cfg, err := parseFlags([]string{"-storm-resume", "-scenario", "storm"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if runs := cfg.runs(); len(runs) != 1 || !runs[0].StormResume || runs[0].StormMoved != 0.1 {
		t.Errorf("runs %+v, want one storm with -storm-resume, 10 %% moved", runs)
	}
	if got := movedTasks(1000, 0.1); len(got) != 100 || !slices.IsSorted(got) || !slices.Equal(got, movedTasks(1000, 0.1)) {
		t.Errorf("movedTasks(1000, 0.1): %d tasks %v", len(got), got)
	}
	if n := watchersOf([]int{0, 5, 19}, 50, 20); n != 3+3+2 {
		t.Errorf("watchers of tasks 0, 5, 19 of 20 among 50 connections: %d, want 8", n)
	}
}

// A connection's first task event is its initial state: it times the
// connect, never a delivery's latency, even when the version it carries
// was published after the dial (a client that reconnects while updates
// flow). The next event published after the dial is a latency.
func TestFirstEventTimesTheConnect(t *testing.T) {
	w := testWorker(false)
	c := &conn{w: w, task: 1, dialStart: 1_000_000}
	c.onTask([]byte(`{"task_id":"lt_1","version":1,"sent_ns":2000000}`), 900_000_000)
	c.onTask([]byte(`{"task_id":"lt_1","version":2,"sent_ns":901000000}`), 906_000_000)
	var latencies, connects int64
	for i := range w.phase.Load().shards {
		s := &w.phase.Load().shards[i]
		latencies += s.latency.TotalCount()
		connects += s.connect.TotalCount()
		if s.latency.TotalCount() > 0 && s.latency.Max() > 5_100 {
			t.Errorf("latency max %d µs, want 5,000: the initial state's wait was counted", s.latency.Max())
		}
	}
	if latencies != 1 || connects != 1 {
		t.Errorf("%d latencies and %d connects, want 1 and 1", latencies, connects)
	}
}

// After a since mark (a node's loss), a node's latency is its own clients':
// a client that reconnected after the mark counts in the phase's latency,
// not in its new node's.
func TestByNodeLatencyIsTheStayedClients(t *testing.T) {
	w := testWorker(false)
	w.urls = []string{"a", "b"}
	w.setPhase("move")
	w.since.Store(500_000_000)
	stayed := &conn{w: w, task: 1, dialStart: 1_000_000, gotFirst: true}
	moved := &conn{w: w, task: 2, dialStart: 600_000_000, gotFirst: true}
	stayed.node.Store(1)
	moved.node.Store(1)
	stayed.onTask([]byte(`{"task_id":"lt_1","version":1,"sent_ns":700000000}`), 702_000_000)
	moved.onTask([]byte(`{"task_id":"lt_2","version":1,"sent_ns":700000000}`), 900_000_000)
	p := w.phase.Load()
	if n := p.byNode[1].h.TotalCount(); n != 1 {
		t.Fatalf("node b timed %d deliveries, want 1: the stayed client's", n)
	}
	if max := p.byNode[1].h.Max(); max > 2_100 {
		t.Errorf("node b's max %d µs, want 2,000: the moved client's delivery was counted", max)
	}
	var all int64
	for i := range p.shards {
		all += p.shards[i].latency.TotalCount()
	}
	if all != 2 {
		t.Errorf("the phase timed %d deliveries, want both", all)
	}
}

// A fleet's nodes share what a stock PostgreSQL server accepts.
func TestNodeDatabaseURLFitsTheServer(t *testing.T) {
	for _, tc := range []struct {
		url  string
		n    int
		want string
	}{
		{"postgres://h/db", 5, "postgres://h/db"},
		{"postgres://h/db?sslmode=disable", 8, "postgres://h/db?sslmode=disable&pool_max_conns=10"},
		{"postgres://h/db", 64, "postgres://h/db?pool_max_conns=2"},
	} {
		if got := nodeDatabaseURL(tc.url, tc.n); got != tc.want {
			t.Errorf("nodeDatabaseURL(%q, %d) = %q, want %q", tc.url, tc.n, got, tc.want)
		}
	}
}
