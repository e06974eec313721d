package main

import (
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pushd/pushd/auth"
	"github.com/pushd/pushd/keys"
)

// run is one scenario's world: the servers, the publisher, the workers and
// the result being filled in.
type run struct {
	cfg     config
	res     *result
	stderr  io.Writer
	start   time.Time
	tmp     string
	redis   redisDeployment
	db      *database
	nodes   fleet // the servers under test: one, or three pushd nodes with -cluster
	kind    serverKind
	rdb     redis.UniversalClient // pushd's Redis, for the publisher and diagnose; nil for Centrifugo
	names   keys.Names            // the task keys as pushd spells them on r.redis
	pub     *publisher
	samp    *sampler
	workers []*workerProc
	secret  []byte

	expectSeq int64 // the latest expect command's Seq
	// endedCPU is, by node, the CPU time of its processes that ended
	// (-kill-node, -roll), in clock ticks: mark counts it on.
	endedCPU []int64
}

func (r *run) logf(format string, args ...any) {
	if r.cfg.Verbose {
		fmt.Fprintf(r.stderr, "loadtest: %6.2fs %s/%s: %s\n", time.Since(r.start).Seconds(), r.cfg.Scenario, r.cfg.Transport, fmt.Sprintf(format, args...))
	}
}

// all sends cmd to every worker (made per worker by mk, or cmd as is) and
// waits for each one's reply of type want.
func (r *run) all(ctx context.Context, mk func(i int) command, want string, timeout time.Duration) ([]reply, error) {
	for i, w := range r.workers {
		if err := w.send(mk(i)); err != nil {
			return nil, err
		}
	}
	out := make([]reply, len(r.workers))
	for i, w := range r.workers {
		rp, err := w.await(ctx, want, timeout)
		if err != nil {
			return nil, err
		}
		out[i] = rp
	}
	return out, nil
}

func (r *run) broadcast(cmd command) error {
	for _, w := range r.workers {
		if err := w.send(cmd); err != nil {
			return err
		}
	}
	return nil
}

func (r *run) phase(ctx context.Context, name string) error {
	_, err := r.all(ctx, func(int) command { return command{Cmd: "phase", Phase: name} }, "phased", 10*time.Second)
	r.logf("phase %s", name)
	return err
}

// openGroup is connections First..First+Count-1 over one transport.
type openGroup struct {
	first, count int
	transport    string
}

// openGroups are the run's connections: all over its transport, or for
// stall, half over SSE and half over WebSocket.
func (r *run) openGroups() []openGroup {
	if r.cfg.Scenario == "stall" {
		half := r.cfg.Conns / 2
		return []openGroup{{0, half, "sse"}, {half, r.cfg.Conns - half, "ws"}}
	}
	return []openGroup{{0, r.cfg.Conns, r.cfg.Transport}}
}

// connectAll opens every connection, ramped, and waits until each holds its
// task's current version.
func (r *run) connectAll(ctx context.Context) error {
	n := len(r.workers)
	started := time.Now()
	opened, failed := 0, 0
	for _, g := range r.openGroups() {
		per := (g.count + n - 1) / n
		timeout := time.Duration(float64(g.count)/r.cfg.Ramp*2*float64(time.Second)) + time.Minute
		replies, err := r.all(ctx, func(i int) command {
			first := i * per
			return command{Cmd: "open", First: g.first + first, Count: max(0, min(per, g.count-first)), Tasks: r.cfg.Tasks,
				Rate: r.cfg.Ramp / float64(n), Transport: g.transport}
		}, "opened", timeout)
		if err != nil {
			return err
		}
		for _, rp := range replies {
			opened += rp.Opened
			failed += rp.Failed
		}
	}
	r.logf("opened %d connections (%d failed at first) in %v", opened, failed, time.Since(started).Round(time.Millisecond))
	if failed > 0 {
		r.res.warn("%d of %d connections failed their first attempt (they retried)", failed, r.cfg.Conns)
	}
	if !r.kind.snapshotOnSubscribe {
		// Every client is subscribed: each task's first snapshot reaches
		// all its watchers now.
		if err := r.publishEach(ctx); err != nil {
			return err
		}
	}
	conv, live, _, err := r.converge(ctx, r.pub.lastVersions(), r.cfg.Settle+time.Duration(r.cfg.Conns/1000)*time.Second)
	if err != nil {
		return err
	}
	r.res.fig("connect_all_s", time.Since(started).Seconds(), "s", false)
	if conv < live {
		r.clientCountsAtFailure(ctx)
		return fmt.Errorf("only %d of %d connections got their task's snapshot after connecting", conv, live)
	}
	return nil
}

// clientCountsAtFailure records, for a run that stops short, what its
// clients counted (errors by kind, reconnects), so the result says why.
func (r *run) clientCountsAtFailure(ctx context.Context) {
	replies, err := r.all(ctx, func(int) command { return command{Cmd: "report"} }, "report", 30*time.Second)
	if err != nil {
		r.logf("no client counts at the failure: %v", err)
		return
	}
	m := mergeReports(r.cfg.Scenario, replies)
	r.res.ClientCounts = m.Errors
	r.logf("client counts at the failure: %v", m.Errors)
	// And the server's side of it: what refused them, by rule.
	if r.res.ServerMetrics == nil {
		r.res.ServerMetrics = ownSeries(r.scrape(ctx), r.kind.prefix)
	}
}

// converge sets the expected versions and waits until every live connection
// holds at least them, or timeout. at is when the last one got there.
func (r *run) converge(ctx context.Context, versions []int64, timeout time.Duration) (conv, live int, at time.Time, err error) {
	if err := r.expect(versions); err != nil {
		return 0, 0, time.Time{}, err
	}
	return r.waitConverged(ctx, timeout)
}

func (r *run) expect(versions []int64) error {
	r.expectSeq++
	return r.broadcast(command{Cmd: "expect", Versions: versions, Seq: r.expectSeq})
}

func (r *run) waitConverged(ctx context.Context, timeout time.Duration) (conv, live int, at time.Time, err error) {
	deadline := time.Now().Add(timeout)
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	lastLog := time.Now()
	for {
		conv, live = 0, 0
		var atNs int64
		fresh := true
		for _, w := range r.workers {
			w.progMu.Lock()
			fresh = fresh && w.prog.Seq == r.expectSeq
			conv += w.prog.Converged
			live += w.prog.Live
			atNs = max(atNs, w.prog.ConvergedAtNs)
			w.progMu.Unlock()
		}
		at = time.Unix(0, atNs)
		if fresh && conv >= live {
			return conv, live, at, nil
		}
		if time.Now().After(deadline) {
			return conv, live, at, nil
		}
		if time.Since(lastLog) > 2*time.Second {
			r.logf("converged %d/%d", conv, live)
			lastLog = time.Now()
		}
		select {
		case <-ctx.Done():
			return conv, live, at, ctx.Err()
		case <-tick.C:
		}
	}
}

// final waits for every connection to hold its task's last version and
// collects the workers' reports.
func (r *run) final(ctx context.Context) (*merged, error) {
	started := time.Now()
	conv, live, _, err := r.converge(ctx, r.pub.lastVersions(), r.cfg.Settle)
	if err != nil {
		return nil, err
	}
	r.logf("final convergence %d/%d after %v", conv, live, time.Since(started).Round(time.Millisecond))
	replies, err := r.all(ctx, func(int) command { return command{Cmd: "report"} }, "report", 30*time.Second)
	if err != nil {
		return nil, err
	}
	m := mergeReports(r.cfg.Scenario, replies)
	r.res.setConvergence(m)
	if rss := r.workersRSS(); m.Live > 0 && rss > 0 {
		r.res.fig("loadgen_rss_per_conn_kb", float64(rss)/float64(m.Live), "KB/conn", false)
	}
	r.res.fig("loadgen_goroutines_per_conn", float64(m.Goroutines)/float64(max(m.Live, 1)), "goroutines/conn", false)
	final := r.scrape(ctx)
	if len(r.nodes) > 1 {
		if each, err := r.nodes.scrapeEach(ctx); err == nil {
			for _, m := range each {
				r.res.NodeConnections = append(r.res.NodeConnections, m["pushd_connections"])
			}
		}
	}
	if r.res.ServerMetrics == nil {
		r.res.ServerMetrics = map[string]float64{}
	}
	for k, v := range ownSeries(final, r.kind.prefix) {
		if _, ok := r.res.ServerMetrics[k]; !ok {
			r.res.ServerMetrics[k] = v
		}
	}
	if r.cfg.production() {
		r.admissionFigures(final)
	}
	if m.Converged < m.Live && r.kind.name == "pushd" {
		r.diagnose(ctx, m.StuckTasks)
	}
	return m, nil
}

// admissionFigures reports, under -limits production, what the limits
// did over the run: the checks refused (a refused client retries, so a
// run can converge with some) and those decided on local limits because
// the control Redis did not answer within --admission-timeout.
func (r *run) admissionFigures(m metrics) {
	var rejected float64
	for k, v := range m {
		if strings.HasPrefix(k, "pushd_admission_rejected_total{") {
			rejected += v
		}
	}
	r.res.fig("admission_rejected", rejected, "", false)
	r.res.fig("admission_fallbacks", m["pushd_admission_fallbacks_total"], "", false)
	if rejected > 0 {
		r.res.warn("-limits production: pushd refused %v admission checks (pushd_admission_rejected_total by rule in server_metrics)", rejected)
	}
}

// ownSeries is the server's own series of a scrape (names starting with
// prefix), for the result: histogram buckets are many and say little
// there, and a summary's quantile with no observations is NaN, which JSON
// cannot hold.
func ownSeries(m metrics, prefix string) metrics {
	out := metrics{}
	for k, v := range m {
		if strings.HasPrefix(k, prefix) && !strings.Contains(k, "_bucket{") && !math.IsNaN(v) && !math.IsInf(v, 0) {
			out[k] = v
		}
	}
	return out
}

func (r *run) mark() cpuMark {
	m := cpuMark{at: time.Now(), self: procCPU(os.Getpid()), nodes: r.nodes.cpu(), nodesKernel: r.nodes.kernelCPU()}
	for i, t := range r.endedCPU {
		m.nodes[i] += t
	}
	for _, w := range r.workers {
		m.workers += procCPU(w.proc.pid())
	}
	for _, pid := range r.redis.pids() {
		m.redis += procCPU(pid)
	}
	m.machineBusy, m.machineTotal = machineCPU()
	return m
}

func (r *run) scrape(ctx context.Context) metrics {
	m, err := r.nodes.scrape(ctx)
	if err != nil {
		r.logf("scrape: %v", err)
		return metrics{}
	}
	return m
}

// runOne sets up the servers and workers of one run, runs its scenario and
// tears everything down, whatever happened. bin is the server under test
// (cfg.Target's).
func runOne(ctx context.Context, cfg config, bin, commit, dir string, stderr io.Writer) (res *result, err error) {
	res = newResult(cfg, commit)
	r := &run{cfg: cfg, res: res, stderr: stderr, start: time.Now(), tmp: dir, secret: []byte(randomHex(32)),
		kind: serverKinds[cfg.Target]}
	defer func() {
		if err != nil {
			res.fail("%v", err)
		}
		res.finish(r)
	}()

	if cfg.Pin {
		if err := pinSelf(1); err != nil {
			return res, err
		}
		restore, err := pinProcesses("postgres", 1)
		defer restore()
		if err != nil {
			return res, err
		}
	}
	if r.redis, err = startRedis(ctx, cfg, dir); err != nil {
		return res, err
	}
	defer func() { r.redis.kill() }()
	defer func() { r.db.drop() }() // the database startPushd creates; nil for Centrifugo
	defer func() {
		if r.rdb != nil {
			r.rdb.Close()
		}
		r.nodes.kill()
	}()
	if cfg.Target == "centrifugo" {
		err = r.startCentrifugo(ctx, bin)
	} else {
		err = r.startPushd(ctx, bin)
	}
	if err != nil {
		return res, err // with the node's log
	}

	sctx, stopSampler := context.WithCancel(ctx)
	r.samp = &sampler{nodes: r.nodes, connections: r.kind.connections, deliveries: r.kind.deliveries, start: r.start}
	var sampling sync.WaitGroup
	sampling.Go(func() { r.samp.run(sctx) })
	defer func() { stopSampler(); sampling.Wait() }()

	defer func() {
		for _, w := range r.workers {
			w.quit()
		}
	}()
	if err := r.startWorkers(ctx); err != nil {
		return res, err
	}
	if r.kind.snapshotOnSubscribe {
		// Every task starts with one snapshot, published before anyone
		// connects.
		if err := r.publishEach(ctx); err != nil {
			return res, err
		}
	}
	r.logf("started: redis %s, %s %s, %d workers", r.redis.url(), r.kind.name, strings.Join(r.nodes.urls(), ","), cfg.Workers)

	// The server at rest before anyone connects: what it must come back to
	// once every client is gone.
	_, baseline := r.samp.settled(ctx, 2)

	scenario := map[string]func(context.Context, *run) error{
		"idle": runIdle, "fanout": runFanout, "churn": runChurn, "storm": runStorm, "outage": runOutage, "stall": runStall,
		"repair": runRepair,
	}[cfg.Scenario]
	if err := scenario(ctx, r); err != nil {
		if tail := r.nodes.logTail(); tail != "" {
			err = fmt.Errorf("%w\n%s log:\n%s", err, r.kind.name, tail)
		}
		return res, err
	}
	if api, ok := r.pub.dst.(*centrifugoAPI); ok {
		// The publisher's keep-alive connections to the HTTP API hold a
		// goroutine each in Centrifugo, which the disconnect check would
		// count against it: they were not there at the baseline.
		api.client.CloseIdleConnections()
	}
	return res, r.disconnectAll(ctx, baseline)
}

// startPushd creates the run's database with every task's row, starts the
// pushd nodes (one, or three with -cluster) and the publisher that writes
// what the Task State Service writes. The caller drops the database and
// kills the nodes.
func (r *run) startPushd(ctx context.Context, bin string) error {
	cfg := r.cfg
	var err error
	if r.db, err = createDatabase(ctx, cfg.DatabaseURL); err != nil {
		return err
	}
	if err := r.db.insertTasks(ctx, cfg.Tasks, cfg.Tenants, time.Now()); err != nil {
		return err
	}
	if r.nodes, err = r.newFleet(bin, r.tmp); err != nil {
		return err
	}
	r.res.Server.Args = cfg.ServerArgs
	r.res.Server.Env = cfg.serverEnv()
	if err := r.nodes.start(ctx); err != nil {
		return err // with the node's log
	}
	r.names = r.redis.names()
	r.rdb = r.redis.client(cfg.Publishers)
	var streamMaxLen int64
	if cfg.StormResume {
		streamMaxLen = pushdStreamMaxLen // the nodes run with --streams: the Task State Service must append
	}
	r.pub = newPublisher(newRedisStore(r.rdb, r.names, streamMaxLen), r.db.pool, cfg.PGWrites, cfg.Tasks, cfg.Tenants, cfg.Publishers, cfg.SnapshotBytes)
	r.pub.every = cfg.PubEvery
	r.pub.fromWrite = cfg.LatencyFrom == "write"
	return nil
}

// startWorkers starts the worker processes and tells each where the
// servers are; r.workers holds every one started, for the caller to quit.
func (r *run) startWorkers(ctx context.Context) error {
	var sources []string
	for i := range r.cfg.Sources {
		sources = append(sources, "127.0.0."+strconv.Itoa(2+i))
	}
	for i := range r.cfg.Workers {
		w, err := startWorker(i, r.cfg.ProfileWorkers, r.cfg.loadCPUs(), r.stderr)
		if err != nil {
			return err
		}
		r.workers = append(r.workers, w)
	}
	_, err := r.all(ctx, func(i int) command {
		return command{Cmd: "init", URLs: r.nodes.urls(), Transport: r.cfg.Transport, Target: r.kind.name, Secret: r.secret,
			Sources: sources, Tenants: r.cfg.Tenants, Worker: i, OwnUsers: r.cfg.production(), Deltas: r.cfg.Deltas,
			WSCompression: r.cfg.WSCompression}
	}, "ready", 30*time.Second)
	return err
}

// publishEach publishes every task's next version once, the snapshot every
// client must hold before a scenario starts.
func (r *run) publishEach(ctx context.Context) error {
	before := r.pub.stats().Stored
	r.pub.each(ctx)
	if s := r.pub.stats(); s.Stored-before != int64(r.cfg.Tasks) {
		return fmt.Errorf("initial publish: %s (%s)", s, s.LastError)
	}
	return nil
}

// startRedis starts the run's private Redis: a cluster with -cluster, else
// one redis-server.
func startRedis(ctx context.Context, cfg config, dir string) (redisDeployment, error) {
	if cfg.Cluster {
		return startRedisCluster(ctx, cfg.RedisServer, dir)
	}
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	rs := &redisServer{bin: cfg.RedisServer, dir: dir, port: port, cpus: cfg.loadCPUs(), nice: cfg.RedisNice}
	if err := rs.start(ctx); err != nil {
		return nil, err
	}
	return rs, nil
}

// newFleet makes the run's pushd nodes, not yet started: cfg.nodeCount()
// of them (one, or three with -cluster unless -nodes says), each on ports, a
// log directory and a node name of its own.
func (r *run) newFleet(bin, dir string) (fleet, error) {
	cfg := r.cfg
	n := cfg.nodeCount()
	common := []string{"--redis-url", r.redis.url(), "--database-url", nodeDatabaseURL(r.db.url, n), "--jwt-secret", string(r.secret), "--log-level", "warn"}
	if cfg.Cluster {
		common = append(common, "--redis-cluster")
	}
	if cfg.Scenario == "storm" {
		common = append(common, "--drain-timeout", "2s")
	}
	if cfg.StormResume {
		common = append(common, "--streams")
	}
	if cfg.PGWrites == "only" {
		common = append(common, "--read-changes")
	}
	if cfg.WSCompression {
		common = append(common, "--ws-compression")
	}
	env := append(cfg.limitsEnv(), cfg.serverEnv()...)
	if cfg.RepairInterval > 0 {
		env = append(env, "PUSHD_REPAIR_INTERVAL="+cfg.RepairInterval.String())
	}
	var f fleet
	used := map[int]bool{}
	for i := range n {
		port, err := r.freshPort(used)
		if err != nil {
			return nil, err
		}
		name, logDir := "loadtest", dir
		if n > 1 {
			name, logDir = "loadtest-"+strconv.Itoa(i), filepath.Join(dir, "node"+strconv.Itoa(i))
			if err := os.MkdirAll(logDir, 0o755); err != nil {
				return nil, err
			}
		}
		adminPort, err := r.freshPort(used)
		if err != nil {
			return nil, err
		}
		args := append([]string{"--listen", "127.0.0.1:" + strconv.Itoa(port)}, common...)
		args = append(append(args, "--node-name", name), cfg.ServerArgs...)
		// The admin listener through the environment: a server built from
		// a commit older than it still starts.
		nodeEnv := append(slices.Clip(env), "PUSHD_ADMIN_LISTEN=127.0.0.1:"+strconv.Itoa(adminPort))
		debugPort := 0
		if cfg.ProfileNodes != "" {
			if debugPort, err = r.freshPort(used); err != nil {
				return nil, err
			}
			nodeEnv = append(nodeEnv, "PUSHD_DEBUG_LISTEN=127.0.0.1:"+strconv.Itoa(debugPort))
		}
		f = append(f, &serverProc{name: "pushd", health: "/healthz", bin: bin, args: args, env: nodeEnv, port: port, adminPort: adminPort, debugPort: debugPort, logDir: logDir, cpus: cfg.serverCPUs()})
	}
	return f, nil
}

// pgConnBudget is how many PostgreSQL connections a fleet's nodes may open
// together: a stock server's max_connections (100), less the publisher's,
// the harness's and what other work on the machine keeps.
const pgConnBudget = 80

// nodeDatabaseURL is url with each of n nodes' pools sized to share
// pgConnBudget, when their default (12 each) would not fit in it.
func nodeDatabaseURL(url string, n int) string {
	const nodeDefault = 12
	if n*nodeDefault <= pgConnBudget {
		return url
	}
	sep := "?"
	if strings.Contains(url, "?") {
		sep = "&"
	}
	return url + sep + "pool_max_conns=" + strconv.Itoa(max(2, pgConnBudget/n))
}

// freshPort is a free port not in used, which it joins: each of a fleet's
// ports is picked free and closed again before its node listens, so
// nothing else stops the kernel handing one out twice.
func (r *run) freshPort(used map[int]bool) (int, error) {
	for range 100 {
		p, err := freePort()
		if err != nil || !used[p] {
			used[p] = true
			return p, err
		}
	}
	return 0, fmt.Errorf("no free port unlike the %d taken", len(used))
}

// goroutineSlack is how many goroutines above its pre-connect baseline the
// server may keep once every client is gone: what it starts on first use
// (0 to 2 measured), far below one per client (the smallest run has 50).
// SSE connections hold no goroutine while idle, so pushd_connections is
// checked as well.
const goroutineSlack = 5

// disconnectAll closes every client and waits until the server holds no
// connection and its goroutines are back within goroutineSlack (per node)
// of baseline; a server that keeps them fails the run.
func (r *run) disconnectAll(ctx context.Context, baseline float64) error {
	slack := goroutineSlack * len(r.nodes)
	if _, err := r.all(ctx, func(int) command { return command{Cmd: "close"} }, "closed", 30*time.Second); err != nil {
		return err
	}
	closed := time.Now()
	deadline := closed.Add(disconnectWait)
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	var g, conns float64
	for {
		m := r.scrape(ctx)
		g, conns = m["go_goroutines"], m[r.kind.connections]
		if g > 0 && conns == 0 && g <= baseline+float64(slack) {
			break
		}
		if time.Now().After(deadline) {
			r.res.fig("goroutines_baseline", baseline, "", false)
			r.res.fig("goroutines_after_disconnect", g, "", false)
			r.res.fig("connections_after_disconnect", conns, "", false)
			r.res.fail("SERVER KEPT GOROUTINES: %v goroutines and %v connections %v after every client disconnected, want at most the %v before anyone connected + %d",
				g, conns, disconnectWait, baseline, slack)
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}
	r.logf("server back to %v goroutines (baseline %v) %v after every client disconnected", g, baseline, time.Since(closed).Round(time.Millisecond))
	r.res.fig("goroutines_baseline", baseline, "", false)
	r.res.fig("goroutines_after_disconnect", g, "", false)
	r.res.fig("connections_after_disconnect", conns, "", false)
	r.res.fig("disconnect_settle_s", time.Since(closed).Seconds(), "s", false)
	return nil
}

// disconnectWait bounds how long the server may take to release every
// closed client: an idle SSE connection whose client left is found by the
// disconnect check, every 5 s.
const disconnectWait = 15 * time.Second

// quietRedis drops go-redis's own log lines: a Redis killed on purpose would
// otherwise print one per failed dial. The publisher counts its errors.
type quietRedis struct{}

func (quietRedis) Printf(context.Context, string, ...any) {}

// diagnose says, for a few tasks whose watchers did not converge, which
// version each layer holds: what was published, what Redis stores, and what
// the server answers on GET /v1/tasks/{id} (its read path, caches included).
func (r *run) diagnose(ctx context.Context, tasks []int) {
	want := r.pub.lastVersions()
	for i, t := range tasks {
		if i == 3 {
			break
		}
		id := taskID(t)
		var inRedis, fromAPI int64 = -1, -1
		if b, err := r.rdb.Get(ctx, r.names.Snapshot(id)).Bytes(); err == nil {
			inRedis, _ = jsonInt(b, `"version":`)
		}
		tok, _ := auth.NewSigner(r.secret).Sign(auth.Principal{TenantID: tenantOf(t, r.cfg.Tenants), UserID: userOf(t, r.cfg.Tenants), ExpiresAt: time.Now().Add(time.Hour)})
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, r.nodes[t%len(r.nodes)].baseURL()+"/v1/tasks/"+id, nil)
		req.Header.Set("Authorization", "Bearer "+tok)
		if resp, err := metricsClient.Do(req); err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			fromAPI, _ = jsonInt(b, `"version":`)
		}
		r.res.warn("task %s did not reach its watchers: published v%d, Redis holds v%d, GET /v1/tasks/%s answers v%d", id, want[t], inRedis, id, fromAPI)
	}
}
