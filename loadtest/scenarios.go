package main

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// runIdle measures what an idle connection costs each part of the
// machine: the server (RSS and goroutines, of the fleet and node by node),
// the load generator's workers, the kernel and Redis, before anyone
// connects and after every connection holds its snapshot and has been held
// idle for -hold.
func runIdle(ctx context.Context, r *run) error {
	// A server with few connections settles at once; a big run gets 3 s
	// and the smallest of several samples (there is no forced GC from outside).
	hold, samples := r.cfg.Hold, 6
	if r.cfg.Conns < 1000 {
		samples = 2
		if hold <= 0 {
			hold = 500 * time.Millisecond
		}
	}
	if hold <= 0 {
		hold = 3 * time.Second
	}
	r.res.Hold = hold.String()
	before := r.samp.settledEach(ctx, max(2, samples-2))
	m0 := r.scrape(ctx)
	k0, workers0 := readKernelMem(), r.workersRSS()
	redis0, keys0 := r.redisMemory(ctx)
	if err := r.connectAll(ctx); err != nil {
		return err
	}
	// The fleet's costs at idle are read over the hold less its first
	// quarter (at most 10 s), which the connect burst's reads end in.
	warm := min(hold/4, 10*time.Second)
	if err := sleepCtx(ctx, warm); err != nil {
		return err
	}
	pushd := r.kind.name == "pushd"
	var idle0 fleetMark
	if pushd {
		idle0 = r.markFleet(ctx)
	}
	if err := sleepCtx(ctx, hold-warm); err != nil {
		return err
	}
	if pushd {
		r.idleCosts(idle0, r.markFleet(ctx))
		r.connsPerNode(r.redis.ports())
	}
	after := r.samp.settledEach(ctx, samples)
	m1 := r.scrape(ctx)
	k1, workers1 := readKernelMem(), r.workersRSS()
	redis1, keys1 := r.redisMemory(ctx)
	rssBefore, rssAfter, gBefore, gAfter := before.RSSKB, after.RSSKB, before.Goroutines, after.Goroutines
	n := float64(r.cfg.Conns)
	r.res.fig("rss_before_mb", float64(rssBefore)/1024, "MB", false)
	r.res.fig("rss_after_mb", float64(rssAfter)/1024, "MB", true)
	r.res.fig("rss_per_conn_kb", float64(rssAfter-rssBefore)/n, "KB/conn", true)
	r.res.fig("goroutines_before", gBefore, "", false)
	r.res.fig("goroutines_after", gAfter, "", false)
	r.res.fig("goroutines_per_conn", (gAfter-gBefore)/n, "goroutines/conn", true)
	r.nodeFigures(before, after)
	if m0["go_memstats_heap_inuse_bytes"] > 0 && m1["go_memstats_heap_inuse_bytes"] > 0 {
		// Nothing forces a GC here: RSS holds what the connect burst freed
		// until the runtime's scavenger returns what lies past the heap
		// goal, and heap_idle less heap_released, summed over the nodes,
		// is the free heap RSS still counted at the reading.
		r.res.fig("server_heap_inuse_per_conn_kb", (m1["go_memstats_heap_inuse_bytes"]-m0["go_memstats_heap_inuse_bytes"])/1024/n, "KB/conn", false)
		r.res.fig("server_heap_free_unreturned_mb", (m1["go_memstats_heap_idle_bytes"]-m1["go_memstats_heap_released_bytes"])/(1<<20), "MB", false)
	}
	if workers0 > 0 && workers1 > 0 {
		// The workers' growth alone: their RSS before anyone connected is
		// the runtime's and the worker's own, not the connections'.
		r.res.fig("loadgen_rss_delta_per_conn_kb", float64(workers1-workers0)/n, "KB/conn", false)
	}
	// Both ends of every connection are sockets of this machine's kernel.
	sock, slab := float64(k1.SockKB-k0.SockKB)/n, float64(k1.SlabKB-k0.SlabKB)/n
	r.res.fig("kernel_per_conn_kb", sock+slab, "KB/conn", true)
	r.res.fig("kernel_sockbuf_per_conn_kb", sock, "KB/conn", false)
	r.res.fig("kernel_slab_per_conn_kb", slab, "KB/conn", false)
	if k0.WholeSlab || k1.WholeSlab {
		r.res.warn("kernel_slab_per_conn_kb is /proc/meminfo's Slab, every cache: /proc/slabinfo is not readable")
	}
	if redis0 > 0 && redis1 > 0 {
		// The task keys expire with their task's status (10 s to an hour)
		// and are written again when a node reads one from PostgreSQL:
		// what they gain or lose meanwhile is not the connections'.
		r.res.fig("redis_mem_per_conn_bytes", float64(redis1-redis0-(keys1.Task-keys0.Task))/n, "B/conn", true)
		r.res.fig("redis_conn_keys_per_conn_bytes", float64(keys1.Conn-keys0.Conn)/n, "B/conn", false)
		r.res.fig("redis_task_keys_change_mb", float64(keys1.Task-keys0.Task)/(1<<20), "MB", false)
	}
	m, err := r.final(ctx)
	if err != nil {
		return err
	}
	if r.kind.snapshotOnSubscribe {
		// Dial to first snapshot; a Centrifugo client's first one waits
		// until every client connected.
		r.res.latency("connect", m.phase("ramp").Connect, true)
	}
	return nil
}

// nodeFigures reports idle's server figures per connection node by node:
// each node's RSS and goroutines after less before, over the connections
// it held after (its pushd_connections; with one node, every connection),
// in per_node, and the least and most RSS per connection of any node.
func (r *run) nodeFigures(before, after rest) {
	rssB, rssA, gB, gA, conns := before.NodeRSSKB, after.NodeRSSKB, before.NodeGoroutines, after.NodeGoroutines, after.NodeConnections
	if len(r.nodes) == 1 {
		rssB, rssA, gB, gA = []int64{before.RSSKB}, []int64{after.RSSKB}, []float64{before.Goroutines}, []float64{after.Goroutines}
		conns = []float64{float64(r.cfg.Conns)}
	}
	k := len(r.nodes)
	if len(rssB) != k || len(rssA) != k || len(gB) != k || len(gA) != k || len(conns) != k {
		r.res.warn("idle: no per-node figures: a node was not sampled before and after")
		return
	}
	var rssPer, gPer []float64
	for i := range k {
		if conns[i] <= 0 {
			r.res.warn("idle: node %d holds no connection", i)
			return
		}
		rssPer = append(rssPer, float64(rssA[i]-rssB[i])/conns[i])
		gPer = append(gPer, (gA[i]-gB[i])/conns[i])
	}
	r.res.PerNode = map[string][]float64{"connections": conns, "server_rss_per_conn_kb": rssPer, "goroutines_per_conn": gPer}
	r.res.fig("server_rss_per_conn_kb_min", slices.Min(rssPer), "KB/conn", true)
	r.res.fig("server_rss_per_conn_kb_max", slices.Max(rssPer), "KB/conn", true)
	if r.cfg.Transport == "mixed" && k > 1 {
		// SSE on the even nodes, WebSocket on the odd ones.
		var sse, ws []float64
		for i, v := range rssPer {
			if i%2 == 0 {
				sse = append(sse, v)
			} else {
				ws = append(ws, v)
			}
		}
		r.res.fig("server_rss_per_conn_kb_max_sse", slices.Max(sse), "KB/conn", true)
		r.res.fig("server_rss_per_conn_kb_max_ws", slices.Max(ws), "KB/conn", true)
	}
}

// workersRSS is the workers' resident sets, summed, in KB.
func (r *run) workersRSS() int64 {
	var rss int64
	for _, w := range r.workers {
		rss += procRSS(w.proc.pid())
	}
	return rss
}

// redisMemory is the run's Redis's used_memory in bytes and what its keys
// take by class; 0 when there is none to read (Centrifugo) or it did not
// answer.
func (r *run) redisMemory(ctx context.Context) (int64, keyMemory) {
	if r.rdb == nil {
		return 0, keyMemory{}
	}
	n, err := usedMemory(ctx, r.rdb)
	if err != nil {
		r.logf("redis memory: %v", err)
		return 0, keyMemory{}
	}
	km, err := keysMemory(ctx, r.rdb, r.names.Prefix)
	if err != nil {
		r.logf("redis keys: %v", err)
		return 0, keyMemory{}
	}
	return n, km
}

// runFanout publishes rate updates/s for duration to connected clients and
// measures delivery latency, deliveries/s and the server's CPU; with
// -kill-master, with one master of the cluster killed halfway through;
// with -kill-node, with node 0 killed halfway through; with -roll, with
// every node restarted in turn.
func runFanout(ctx context.Context, r *run) error {
	if err := r.connectAll(ctx); err != nil {
		return err
	}
	if err := r.phase(ctx, "measure"); err != nil {
		return err
	}
	// perf's split samples from just before the first mark to just after
	// the last: perf is started and read outside the marks' window, whose
	// length the rates divide by.
	var split *cpuSplit
	if !r.cfg.KillMaster && !r.cfg.KillNode && !r.cfg.Roll {
		split = r.startCPUSplit(ctx)
	}
	before, fleet0 := r.mark(), r.markFleet(ctx)
	m0 := fleet0.m
	var pr pubRun
	var kill *masterKill
	var nodeKill *nodeKill
	var roll *nodeRoll
	var err error
	switch {
	case r.cfg.KillMaster:
		pr, kill, err = r.publishKillingMaster(ctx)
	case r.cfg.KillNode:
		pr, nodeKill, err = r.publishKillingNode(ctx)
	case r.cfg.Roll:
		pr, roll, err = r.publishRolling(ctx)
	default:
		stop := r.floodPings(ctx)
		var profiles sync.WaitGroup
		if r.cfg.ProfileNodes != "" {
			// Over the publishing, less a second: the profile ends
			// before the window does.
			profiles.Go(func() {
				r.profileNodes(ctx, r.nodes.indexes(), "measure", max(r.cfg.Duration-time.Second, time.Second))
			})
		}
		pr = r.pub.run(ctx, r.cfg.Rate, r.cfg.Duration)
		stop()
		profiles.Wait()
	}
	if err != nil {
		r.endCPUSplit(ctx, split)
		return err
	}
	after, fleet1 := r.mark(), r.markFleet(ctx)
	m1 := fleet1.m
	kernelShare := r.endCPUSplit(ctx, split) // of the server's CPU; -1 for /proc's split
	if err := r.phase(ctx, "drain"); err != nil {
		return err
	}
	// A node restarted counts from zero again: what its counters grew by
	// over the run is unknown.
	restarted := r.cfg.KillNode || r.cfg.Roll
	if r.kind.name == "pushd" {
		if restarted {
			r.res.note("a node restarted under load: no per-update costs (redis_cmds_per_update, node_redis_reads_per_update, ...), server_deliveries_per_s or conflated, whose counters began again at zero; server CPU adds the ended processes' own")
		} else {
			r.updateCosts(fleet0, fleet1, pr.Sent)
		}
		r.connsPerNode(r.redis.ports())
	}
	cpu := before.to(after)
	cpu.Split = "proc"
	if kernelShare >= 0 {
		cpu.Split = "perf"
		cpu.ServerKernel = cpu.Server * kernelShare
		cpu.ServerUser = cpu.Server - cpu.ServerKernel
	}
	r.res.CPU = &cpu
	r.res.Publish = &pr
	m, err := r.final(ctx)
	if err != nil {
		return err
	}
	if kill != nil {
		if err := r.reportResume(ctx, kill); err != nil {
			return err
		}
	}
	if nodeKill != nil {
		if err := r.reportNodeKill(ctx, nodeKill, m); err != nil {
			return err
		}
	}
	if roll != nil {
		r.reportRoll(roll)
	}
	// The publishing's deliveries: -kill-node's second half is phase move.
	meas, move := m.phase("measure"), m.phase("move")
	deliveries := meas.Deliveries + move.Deliveries
	lat := meas.Latency.Clone()
	lat.Merge(move.Latency)
	lat.Merge(m.phase("drain").Latency)
	r.res.latency("delivery", lat, true)
	r.stages(m0, m1, restarted)
	watchers := float64(r.cfg.Conns) / float64(r.cfg.Tasks)
	r.res.fig("deliveries_per_s", float64(deliveries)/cpu.Seconds, "/s", true)
	r.res.fig("deliveries_asked_per_s", r.cfg.Rate*watchers, "/s", true)
	if !restarted {
		r.res.fig("server_deliveries_per_s", (r.kind.deliveries(m1)-r.kind.deliveries(m0))/cpu.Seconds, "/s", false)
	}
	r.res.fig("publishes_per_s", pr.PerSecond, "/s", false)
	if wire := meas.WireBytes + move.WireBytes; deliveries > 0 && wire > 0 {
		r.res.fig("wire_bytes_per_delivery", float64(wire)/float64(deliveries), "B", true)
	}
	r.res.fig("server_cores", cpu.Server, "cores", true)
	if deliveries > 0 {
		// The server's CPU time per delivery: the yardstick that a shared
		// machine's noise moves least, under -pin least of all.
		r.res.fig("server_us_per_delivery", cpu.Server*cpu.Seconds/float64(deliveries)*1e6, "µs", true)
		r.res.fig("server_user_us_per_delivery", cpu.ServerUser*cpu.Seconds/float64(deliveries)*1e6, "µs", true)
		r.res.fig("server_kernel_us_per_delivery", cpu.ServerKernel*cpu.Seconds/float64(deliveries)*1e6, "µs", true)
	}
	// A collection of a large heap can hold deliveries up for as long as
	// its mark phase runs: how many fell in the window says whether the
	// tail saw the server's steady state.
	if !restarted {
		r.res.fig("server_gc_cycles", m1["go_gc_duration_seconds_count"]-m0["go_gc_duration_seconds_count"], "", true)
	}
	r.res.fig("loadgen_cores", cpu.LoadGen, "cores", false)
	r.res.fig("worker_cores", cpu.Workers, "cores", false)
	r.res.fig("redis_cores", cpu.Redis, "cores", false)
	r.res.fig("machine_busy_pct", cpu.MachineBusy, "%", false)
	r.res.fig("other_cores", cpu.OtherCores, "cores", false)
	if r.kind.name == "pushd" && !restarted {
		r.res.fig("conflated", m1["pushd_conflated_total"]-m0["pushd_conflated_total"], "", false)
	}
	if r.cfg.PingFlooders > 0 {
		flooded := `pushd_disconnects_total{reason="control_flood"}`
		r.res.fig("ping_flooders", float64(r.cfg.PingFlooders), "", true)
		r.res.fig("flood_closed", m1[flooded]-m0[flooded], "", true)
	}
	if rss := lastRSS(r); rss > 0 {
		r.res.fig("server_rss_mb", float64(rss)/1024, "MB", r.cfg.Cluster)
	}
	return nil
}

// stages reports the delivery's stages: the publisher's wait for its
// turn and its store call, for both servers, and on pushd the node's own
// (pushd_notification_*_seconds: hint heard → a dispatcher took the task,
// the read, hint heard → written), from their histograms' buckets. What
// the delivery's mean adds beyond them is the hint's way to the node and
// the written event's to the client.
func (r *run) stages(m0, m1 metrics, restarted bool) {
	waited, called := r.pub.stages()
	if waited != nil {
		r.res.latency("stage_publish_wait", waited, false)
	}
	if called != nil {
		r.res.latency("stage_publish_call", called, false)
	}
	if r.kind.name != "pushd" || restarted {
		return
	}
	for _, st := range [...]struct{ name, series string }{
		{"stage_node_queued", "pushd_notification_queued_seconds"},
		{"stage_node_read", "pushd_notification_read_seconds"},
		{"stage_node_heard_to_written", "pushd_notification_to_write_seconds"},
	} {
		if l, ok := promLatency(m0, m1, st.series); ok {
			r.res.Latencies[st.name] = &l
		}
	}
}

// runChurn keeps connections opening and closing while updates flow.
func runChurn(ctx context.Context, r *run) error {
	if err := r.connectAll(ctx); err != nil {
		return err
	}
	rss0, g0 := r.samp.settled(ctx, 2)
	m0 := r.scrape(ctx)
	if err := r.phase(ctx, "churn"); err != nil {
		return err
	}
	before := r.mark()
	done := make(chan pubRun, 1)
	go func() { done <- r.pub.run(ctx, r.cfg.Rate, r.cfg.Duration) }()
	if _, err := r.all(ctx, func(int) command {
		return command{Cmd: "churn", Rate: r.cfg.ChurnRate / float64(len(r.workers)), Tasks: r.cfg.Tasks}
	}, "churning", 10*time.Second); err != nil {
		return err
	}
	pr := <-done
	if _, err := r.all(ctx, func(int) command { return command{Cmd: "churn"} }, "churning", 30*time.Second); err != nil {
		return err
	}
	after := r.mark()
	if err := r.phase(ctx, "drain"); err != nil {
		return err
	}
	cpu := before.to(after)
	r.res.CPU, r.res.Publish = &cpu, &pr
	m, err := r.final(ctx)
	if err != nil {
		return err
	}
	rss1, g1 := r.samp.settled(ctx, 2)
	m1 := r.scrape(ctx)
	ch := m.phase("churn")
	r.res.latency("connect", ch.Connect, true)
	lat := ch.Latency.Clone()
	lat.Merge(m.phase("drain").Latency)
	r.res.latency("delivery", lat, false)
	r.res.fig("churned_per_s", float64(m.ChurnClosed)/cpu.Seconds, "/s", true)
	r.res.fig("opened_total", m1["pushd_connections_opened_total"]-m0["pushd_connections_opened_total"], "", false)
	r.res.fig("errors", float64(m.errorCount()), "", true)
	r.res.fig("rss_drift_mb", float64(rss1-rss0)/1024, "MB", true)
	r.res.fig("goroutine_drift", g1-g0, "", true)
	r.res.fig("server_cores", cpu.Server, "cores", false)
	r.res.fig("loadgen_cores", cpu.LoadGen, "cores", false)
	return nil
}

// runStorm restarts the node (with -cluster, all three at once, and up is
// when the last of them accepted) with Redis flushed and every task changed in
// PostgreSQL meanwhile, and measures how long every client takes to
// reconnect and converge, and how many PostgreSQL queries that took.
// -storm-resume runs runStormResume instead.
func runStorm(ctx context.Context, r *run) error {
	if r.cfg.StormResume {
		return runStormResume(ctx, r)
	}
	if err := r.connectAll(ctx); err != nil {
		return err
	}
	if err := r.phase(ctx, "storm"); err != nil {
		return err
	}
	stopping := time.Now()
	r.nodes.stop(30 * time.Second)
	r.logf("server stopped after %v", time.Since(stopping).Round(time.Millisecond))
	r.res.fig("drain_s", time.Since(stopping).Seconds(), "s", false)
	if err := flushAll(ctx, r.rdb); err != nil {
		return fmt.Errorf("flushall: %w", err)
	}
	// The Task State Service changed every task while the node was down.
	if _, err := r.db.pool.Exec(ctx, `UPDATE generation_tasks SET version = 2, status = 'RUNNING', progress = 2,
		stage = 'provider_generating', queue_position = NULL, updated_at = now()`); err != nil {
		return fmt.Errorf("update tasks: %w", err)
	}
	r.pub.setAll(2)
	if err := r.expect(r.pub.lastVersions()); err != nil {
		return err
	}
	before, tcp0 := r.mark(), tcpExt(listenCounters...)
	up, err := r.nodes.startAccepting(ctx)
	if err != nil {
		return err
	}
	if err := r.broadcast(command{Cmd: "wake", JitterNs: int64(r.cfg.StormJitter)}); err != nil {
		return err
	}
	conv, live, at, err := r.waitConverged(ctx, max(r.cfg.Settle, 30*time.Second))
	if err != nil {
		return err
	}
	after, tcp1 := r.mark(), tcpExt(listenCounters...)
	cpu := before.to(after)
	r.res.CPU = &cpu
	// Machine-wide counters: an accept queue that overflowed makes clients
	// retransmit their SYN after 1 s, then 3 s.
	r.res.fig("listen_overflows", float64(tcp1["ListenOverflows"]-tcp0["ListenOverflows"]), "", false)
	r.res.fig("syn_retransmits", float64(tcp1["TCPSynRetrans"]-tcp0["TCPSynRetrans"]), "", false)
	if conv == live {
		r.res.fig("converge_s", at.Sub(up).Seconds(), "s", true)
	} else {
		r.res.warn("storm: %d of %d clients converged", conv, live)
	}
	met := r.scrape(ctx)
	m, err := r.final(ctx)
	if err != nil {
		return err
	}
	r.res.latency("reconnect", m.phase("storm").Connect, true)
	q := met["pushd_postgres_queries_total"]
	r.res.fig("pg_queries", q, "", false)
	r.res.fig("pg_queries_per_task", q/float64(r.cfg.Tasks), "queries/task", true)
	r.res.fig("pg_rejected", met["pushd_postgres_rejected_total"], "", true)
	r.res.fig("unavailable_errors", float64(m.Errors["error_event_unavailable"]+m.Errors["rejected_unavailable"]), "", false)
	r.res.fig("server_cores", cpu.Server, "cores", false)
	return nil
}

// runOutage kills Redis under load, keeps publishing to PostgreSQL while it
// is down, restarts it empty, and measures the switch to polling, what
// clients saw meanwhile and how fast everything converged after.
func runOutage(ctx context.Context, r *run) error {
	rs, ok := r.redis.(*redisServer)
	if !ok {
		return fmt.Errorf("outage runs on one redis-server only")
	}
	if err := r.connectAll(ctx); err != nil {
		return err
	}
	if err := r.phase(ctx, "before"); err != nil {
		return err
	}
	warm := min(3*time.Second, r.cfg.Duration/4)
	total := max(r.cfg.Duration, warm+r.cfg.Outage+2*time.Second)
	done := make(chan pubRun, 1)
	before := r.mark()
	go func() { done <- r.pub.run(ctx, r.cfg.Rate, total) }()
	if err := sleepCtx(ctx, warm); err != nil {
		return err
	}

	killed := time.Now()
	rs.kill()
	if err := r.phase(ctx, "outage"); err != nil {
		return err
	}
	if t, ok := r.waitMode(ctx, "polling", r.cfg.Outage); ok {
		r.res.fig("to_polling_s", t.Sub(killed).Seconds(), "s", true)
	} else {
		r.res.warn("outage: the server did not report polling within %v", r.cfg.Outage)
	}
	if err := sleepCtx(ctx, time.Until(killed.Add(r.cfg.Outage))); err != nil {
		return err
	}

	if err := rs.start(ctx); err != nil {
		return fmt.Errorf("restart redis: %w", err)
	}
	restarted := time.Now()
	if err := r.phase(ctx, "recovery"); err != nil {
		return err
	}
	r.logf("redis back after %v", restarted.Sub(killed).Round(time.Millisecond))
	// Every client must catch up with what was written during the outage.
	caught := r.pub.lastVersions()
	if err := r.expect(caught); err != nil {
		return err
	}
	if t, ok := r.waitMode(ctx, "push", 30*time.Second); ok {
		r.res.fig("to_push_s", t.Sub(restarted).Seconds(), "s", false)
	} else {
		r.res.warn("outage: the server did not report push within 30s of Redis coming back")
	}
	conv, live, at, err := r.waitConverged(ctx, max(r.cfg.Settle, 30*time.Second))
	if err != nil {
		return err
	}
	if conv == live {
		r.res.fig("catch_up_s", max(0, at.Sub(restarted).Seconds()), "s", true)
	} else {
		r.res.warn("outage: %d of %d clients caught up with the outage's writes", conv, live)
	}
	pr := <-done
	after := r.mark()
	if err := r.phase(ctx, "drain"); err != nil {
		return err
	}
	cpu := before.to(after)
	r.res.CPU, r.res.Publish = &cpu, &pr
	m, err := r.final(ctx)
	if err != nil {
		return err
	}
	r.res.latency("before", m.phase("before").Latency, false)
	r.res.latency("outage_staleness", m.phase("outage").Latency, true)
	r.res.latency("recovery", m.phase("recovery").Latency, false)
	if s, ok := m.ModeEvents["polling"]; ok {
		r.res.fig("clients_polling_first_s", time.Unix(0, s.FirstNs).Sub(killed).Seconds(), "s", false)
		r.res.fig("clients_polling_last_s", time.Unix(0, s.LastNs).Sub(killed).Seconds(), "s", false)
	}
	ps := r.pub.stats()
	r.res.fig("pg_rows_written", float64(ps.PGWrites), "", false)
	r.res.fig("redis_errors", float64(ps.RedisErrors), "", false)
	return nil
}

// waitMode polls the nodes' pushd_mode every 25 ms until every one reports
// mode.
func (r *run) waitMode(ctx context.Context, mode string, timeout time.Duration) (time.Time, bool) {
	deadline := time.Now().Add(timeout)
	tick := time.NewTicker(25 * time.Millisecond)
	defer tick.Stop()
	for time.Now().Before(deadline) {
		m, err := r.nodes.scrape(ctx)
		if err == nil && m[`pushd_mode{mode="`+mode+`"}`] == float64(len(r.nodes)) {
			return time.Now(), true
		}
		select {
		case <-ctx.Done():
			return time.Time{}, false
		case <-tick.C:
		}
	}
	return time.Time{}, false
}

// sleepCtx waits d, the length of a phase of the scenario.
func sleepCtx(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

func lastRSS(r *run) int64 {
	s := r.samp.all()
	for i := len(s) - 1; i >= 0; i-- {
		if s[i].RSSKB > 0 {
			return s[i].RSSKB
		}
	}
	return 0
}

// runRepair watches quiet tasks (connection i watches task i, nothing is
// published) for -duration and measures what pushd's repair rounds cost
// while there is nothing to repair: the server's CPU, its reads of
// PostgreSQL and the Redis commands of the quiet period.
func runRepair(ctx context.Context, r *run) error {
	if err := r.connectAll(ctx); err != nil {
		return err
	}
	if err := r.phase(ctx, "measure"); err != nil {
		return err
	}
	before, m0, c0 := r.mark(), r.scrape(ctx), r.redisCalls(ctx)
	if err := sleepCtx(ctx, r.cfg.Duration); err != nil { // the measurement window
		return err
	}
	after, m1, c1 := r.mark(), r.scrape(ctx), r.redisCalls(ctx)
	cpu := before.to(after)
	r.res.CPU = &cpu
	if _, err := r.final(ctx); err != nil {
		return err
	}
	d := func(name string) float64 { return m1[name] - m0[name] }
	rounds := d("pushd_repair_rounds_total")
	minutes := cpu.Seconds / 60
	tasks := float64(r.cfg.Tasks)
	r.res.fig("repair_rounds", rounds, "", true)
	r.res.fig("server_cores", cpu.Server, "cores", true)
	r.res.fig("redis_cores", cpu.Redis, "cores", false)
	r.res.fig("db_queries_per_1000_tasks_per_min", d("pushd_repair_db_queries_total")/tasks*1000/minutes, "", true)
	r.res.fig("db_rows_per_task_per_min", d("pushd_repair_db_rows_total")/tasks/minutes, "", true)
	r.res.fig("checked_per_round", d("pushd_repair_checked_total")/max(rounds, 1), "", false)
	r.res.fig("db_queries_per_round", d("pushd_repair_db_queries_total")/max(rounds, 1), "", false)
	r.res.fig("repairs", d(`pushd_repairs_total{found="database_newer"}`)+d(`pushd_repairs_total{found="redis_newer"}`)+d(`pushd_repairs_total{found="not_held"}`), "", false)
	r.res.fig("repair_errors", d("pushd_repair_errors_total"), "", false)
	if c0 != nil && c1 != nil {
		var total float64
		for cmd, n := range c1 {
			total += n - c0[cmd]
		}
		r.res.fig("redis_cmds_per_round", total/max(rounds, 1), "", true)
		for _, cmd := range []string{"mget", "evalsha", "hset"} {
			r.res.fig("redis_"+cmd+"_per_round", (c1[cmd]-c0[cmd])/max(rounds, 1), "", false)
		}
	}
	return nil
}

// redisCalls is the private Redis's calls by command (INFO commandstats:
// the commands scripts run count too), nil on a cluster or when it does
// not answer. The loadtest's own INFO is among them, one call a reading.
func (r *run) redisCalls(ctx context.Context) map[string]float64 {
	if r.cfg.Cluster || r.rdb == nil {
		return nil
	}
	info, err := r.rdb.Info(ctx, "commandstats").Result()
	if err != nil {
		return nil
	}
	calls := make(map[string]float64)
	for line := range strings.SplitSeq(info, "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":calls=")
		cmd, found := strings.CutPrefix(name, "cmdstat_")
		if !ok || !found {
			continue
		}
		n, _, _ := strings.Cut(rest, ",")
		if v, err := strconv.ParseFloat(n, 64); err == nil {
			calls[cmd] = v
		}
	}
	return calls
}
