package main

import (
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/pushd/pushd/snapshot"
)

// scenarios in the order -quick runs them.
var scenarios = []string{"idle", "fanout", "churn", "storm", "outage", "stall", "repair"}

// config is one run's settings. Zero values of the scenario figures (conns,
// tasks, rate, ...) take the scenario's defaults in withDefaults.
type config struct {
	Scenario  string
	Transport string
	Quick     bool
	// Target is the server under test: pushd or centrifugo; runAll
	// expands both into one run of each, pushd first.
	Target string

	// Cluster runs the pushd nodes (three unless Nodes says) on a private
	// Redis Cluster of three masters with a replica each (idle, fanout and
	// storm only); KillMaster, with fanout, kills one master halfway
	// through the publishing.
	Cluster    bool
	KillMaster bool
	// KillNode, with fanout on several nodes, SIGKILLs node 0 halfway
	// through the publishing; Roll restarts every node in turn, with its
	// drain, from a quarter of it on. Their clients move to the other
	// nodes.
	KillNode bool
	Roll     bool
	// Nodes is how many pushd nodes run, each its own process, on the
	// run's Redis; 0 means the default, 1 or with -cluster clusterMasters
	// (nodeCount): left 0 by withDefaults, so a config that sets Cluster
	// after it still gets three.
	Nodes int
	// Limits is pushd's admission limits: "off" turns the per-address and
	// per-user ones off and takes no leases, "production" keeps them as an
	// operator would set them for many clients behind few addresses.
	Limits string
	// Hold is how long idle holds every connection before its memory
	// figures are read; 0 takes the default, 3 s (under 1,000
	// connections, 0.5 s).
	Hold time.Duration

	Conns     int
	Tasks     int
	Tenants   int
	Rate      float64 // updates/s over all tasks
	Duration  time.Duration
	ChurnRate float64 // connections closed and opened per second
	Outage    time.Duration
	Settle    time.Duration // longest wait for convergence
	// RepairInterval is pushd's --repair-interval, set through its
	// environment so that builds from before the setting still start;
	// zero leaves pushd's default.
	RepairInterval time.Duration

	// stall: the stalled clients beside the healthy ones (-conns), and the
	// snapshot size. Negative counts take the scenario's defaults.
	StalledSSE    int
	StalledWS     int
	SnapshotBytes int // 0: the scenario's default (stall 30,000; else about 440, unpadded)

	Workers     int
	PerWorker   int
	Ramp        float64       // new connections per second, over all workers
	Sources     int           // loopback source addresses 127.0.0.2 and up
	Publishers  int           // publisher goroutines, each owning a share of the tasks
	PubEvery    time.Duration // the publisher's schedule tick: updates due are sent together
	PGWrites    string        // auto, always, fallback, off
	LatencyFrom string        // due or write: what a delivery's latency counts from
	StormJitter time.Duration
	// StormResume: storm on a node with --streams, Redis kept, every task
	// updated just before the stop and StormMoved of them while the node
	// is down; measures what the resumed clients are sent.
	StormResume bool
	StormMoved  float64
	// PingFlooders: fanout on pushd: WebSocket clients that send pings as
	// fast as their socket takes them while the updates flow.
	PingFlooders int
	// Pin: the server on CPU 0 with GOMAXPROCS 1, everything else on CPU 1.
	Pin bool
	// Deltas has pushd's clients ask for merge patches (deltas=merge).
	Deltas bool
	// WSCompression runs pushd with --ws-compression and has the
	// WebSocket clients offer permessage-deflate, as browsers do.
	WSCompression bool
	// FindMax: fanout at rising rates until the highest one held.
	FindMax bool

	DatabaseURL string
	RedisServer string
	RedisNice   int // the private Redis's nice; 0 leaves it
	ServerBin   string
	ServerSrc   string // head, worktree, or a git revision
	Repo        string
	ServerArgs  []string
	ServerEnv   []string
	// CentrifugoBin is a Centrifugo binary, built by whoever runs the
	// comparison: the loadtest never builds or downloads it.
	CentrifugoBin string

	Out            string
	Verbose        bool
	ProfileWorkers string
	ProfileNodes   string
	CPUSplit       string // auto, perf or proc: how server CPU is split into user and kernel

	// Command is the command line, for the result.
	Command string
}

func parseFlags(args []string, stderr io.Writer) (config, error) {
	var c config
	fs := flag.NewFlagSet("loadtest", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&c.Scenario, "scenario", "", "idle, fanout, churn, storm, outage, stall or repair (with -quick: empty runs every one)")
	fs.StringVar(&c.Transport, "transport", "sse", "sse, ws, or mixed (idle and fanout: half of each, SSE on the even nodes and WebSocket on the odd ones; with one node, every other connection); with -quick and no -transport: sse and ws in turn; stall always runs both")
	fs.BoolVar(&c.Quick, "quick", false, "a smoke run of every scenario at small scale (200 connections, 5 s)")
	fs.StringVar(&c.Target, "target", "pushd", "the server under test: pushd, centrifugo, or both (pushd, then Centrifugo, same settings); centrifugo runs fanout and idle only and needs -centrifugo-bin")
	fs.BoolVar(&c.Cluster, "cluster", false, "three pushd nodes (or -nodes) on a private Redis Cluster (three masters, a replica each), clients spread over them; idle, fanout and storm only (with -quick: fanout, storm and fanout with -kill-master)")
	fs.IntVar(&c.Nodes, "nodes", 0, "pushd nodes, each its own process, ports and log, on the run's Redis, clients spread over them by connection (connection i dials node i mod nodes); more than one runs idle, fanout, churn and storm (default 1; with -cluster 3)")
	fs.StringVar(&c.Limits, "limits", "off", "pushd's admission limits: off (the per-address connect bucket and stream cap, the per-user connect bucket, the failed-authentication bucket, the API limits and the per-user and per-tenant caps off, so no leases are taken; clients of one user share its token) or production (idle and fanout: pushd's defaults for all of them, caps and leases on, each connection a user of its own whose token grants its task's project, and per source address, since 16 loopback addresses stand for many clients: --max-conns-per-ip max(5000, 1.25 × conns/sources), --connect-ip-rate max(20, 2 × ramp/sources)/s with --connect-ip-burst max(200, that rate), --expected-nodes the node count; a tenant may hold at most pushd's 10,000)")
	fs.DurationVar(&c.Hold, "hold", 0, "idle: how long every connection is held, idle, after all converged, before the memory figures are read (default 3s; under 1000 connections 0.5s)")
	fs.BoolVar(&c.KillMaster, "kill-master", false, "with -cluster -scenario fanout: SIGKILL the master serving tenant t0's channel halfway through the publishing, and measure how long its tenants' deliveries stop")
	fs.BoolVar(&c.KillNode, "kill-node", false, "with -scenario fanout and -nodes 2 or more: SIGKILL node 0 halfway through the publishing, its clients dialing the other nodes, and measure how long until the last of them has an event again (node_kill_back_s), the other nodes' p99 meanwhile and their PostgreSQL reads per task moved; node 0 starts again once the publishing ends")
	fs.BoolVar(&c.Roll, "roll", false, "with -scenario fanout and -nodes 2 or more: from a quarter of -duration on, restart every node in turn as a rolling deploy does (SIGTERM, its drain, start, the next once it accepts), publishing until -duration or 2s after the roll, whichever is later; measures roll_s and roll_node_s_max")
	fs.IntVar(&c.Conns, "conns", 0, "client connections (default by scenario: idle 15000, fanout 10000, churn 2000, storm 10000, outage 2000, stall 1000 healthy ones, half SSE and half WebSocket, repair 10000)")
	fs.IntVar(&c.Tasks, "tasks", 0, "tasks; connection i watches task i mod tasks (default by scenario: idle = conns, fanout 1000, churn 1000, storm 1000, outage 500, stall 100, repair = conns)")
	fs.IntVar(&c.Tenants, "tenants", 10, "tenants the tasks are spread over (stall: default 1, so every stalled client watches every task)")
	fs.Float64Var(&c.Rate, "rate", 0, "updates published per second, spread evenly over the tasks (default: fanout 1000, churn 200, outage 200, stall 100)")
	fs.DurationVar(&c.Duration, "duration", 0, "how long updates flow (default 20s; stall: each of its two phases; repair: how long the quiet tasks are watched, default 60s)")
	fs.Float64Var(&c.ChurnRate, "churn-rate", 0, "churn: connections closed and as many opened per second (default 200)")
	fs.DurationVar(&c.Outage, "outage", 5*time.Second, "outage: how long Redis stays down")
	fs.DurationVar(&c.RepairInterval, "repair-interval", 0, "pushd's --repair-interval, through PUSHD_REPAIR_INTERVAL (default: pushd's, 10s; repair with -quick: 1s)")
	fs.DurationVar(&c.Settle, "settle", 10*time.Second, "longest wait for every connection to hold its task's last version")
	fs.IntVar(&c.StalledSSE, "stalled-sse", 0, "stall: SSE clients that subscribe to every task of their tenant, then never read (default 200)")
	fs.IntVar(&c.StalledWS, "stalled-ws", 0, "stall: WebSocket clients likewise (default 200)")
	fs.IntVar(&c.SnapshotBytes, "snapshot-bytes", 0, "pad every published snapshot to this many bytes (default: stall 30000, else unpadded, about 440)")
	fs.IntVar(&c.Workers, "workers", 0, "worker processes (default conns / per-worker, rounded up)")
	fs.IntVar(&c.PerWorker, "per-worker", 5000, "most connections one worker holds (one process may hold 20000 open files)")
	fs.Float64Var(&c.Ramp, "ramp", 2000, "connections opened per second, over all workers")
	fs.IntVar(&c.Sources, "sources", 16, "loopback source addresses to dial from (127.0.0.2 and up)")
	fs.IntVar(&c.Publishers, "publishers", 16, "publisher goroutines (publishes in flight)")
	fs.StringVar(&c.LatencyFrom, "latency-from", "due", "what a delivery's latency counts from: due (when the schedule handed the update over, so the wait behind the publisher goroutine's earlier writes counts too: a store that slows down shows) or write (when its Redis write began: the publisher's own queue left out, for a machine too busy for the publisher to keep the rate)")
	fs.DurationVar(&c.PubEvery, "publish-every", time.Millisecond, "the publisher sends the updates due every this often, together: 1ms spreads them evenly, 100ms sends bursts of a tenth of a second's updates")
	fs.StringVar(&c.PGWrites, "pg-writes", "auto", "PostgreSQL row updates by the publisher: always (the row first, then Redis, as the Task State Service does), fallback (only when Redis fails), only (the row alone, its snapshot's fields in extra; the nodes run with --read-changes and publish it), off; auto is off for idle, repair and -target both, always otherwise")
	fs.DurationVar(&c.StormJitter, "storm-jitter", 0, "storm: each client waits a random delay up to this before reconnecting (0: all at once)")
	fs.BoolVar(&c.StormResume, "storm-resume", false, "storm: clients resume instead: pushd runs with --streams, Redis is kept, every task is updated (with stream entries) in the seconds before the stop (at -rate, default tasks/2 per second, each task twice) and -storm-moved of them while the node is down; measures the task events each reconnected client gets from its reconnect until two repair intervals (-repair-interval, default pushd's 10s) after every client reconnected and converged: events_per_client_after_resume (ideally the moved share), resent_unchanged and the node's repairs in that quiet window. A running task's snapshot stays 10 s in Redis, and a repair round offers only what Redis holds: a short -repair-interval (2s) puts rounds inside that time")
	fs.Float64Var(&c.StormMoved, "storm-moved", 0.1, "with -storm-resume: the share of the tasks (above 0, at most 1) moved to a new version while the node is down, picked at random, the same for a given -tasks")
	fs.BoolVar(&c.Deltas, "deltas", false, "pushd's clients ask for deltas (deltas=merge), as pushd.js does: later versions come as merge patches, which the clients read as task events; wire_bytes_per_delivery shows what they save")
	fs.BoolVar(&c.WSCompression, "ws-compression", false, "pushd runs with --ws-compression and its WebSocket clients offer permessage-deflate, as browsers do, and inflate what comes compressed; wire_bytes_per_delivery shows what it saves")
	fs.StringVar(&c.CPUSplit, "cpu-split", "auto", "how fanout splits the server's CPU into user and kernel time: perf (sample the server with perf's cpu-clock), proc (/proc's user and system times, counted a whole tick at a time on kernels without virtual CPU accounting), or auto (perf where it runs, else proc)")
	fs.BoolVar(&c.Pin, "pin", false, "on two cores: run the server under test on CPU 0 alone with GOMAXPROCS=1 (pushd and Centrifugo alike), and the load generator, its workers, the private Redis and the shared PostgreSQL's processes on CPU 1 (given every CPU back after the run); figures then count the server's own core")
	fs.BoolVar(&c.FindMax, "find-max", false, "fanout: find the highest rate each server holds (every update delivered, p99 ≤ 100 ms, the publisher keeping up): runs from -rate, doubling while held, then halving the gap to within 10 %; reports max_held_rate")
	fs.IntVar(&c.PingFlooders, "ping-flooders", 0, "fanout on pushd: this many extra WebSocket clients send pings as fast as their socket takes them while updates flow, each reconnecting a second after the server closes it")
	fs.StringVar(&c.DatabaseURL, "database-url", "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable", "PostgreSQL server on which a database of the run's own is created and dropped")
	fs.StringVar(&c.RedisServer, "redis-server", "redis-server", "redis-server binary for the private Redis")
	fs.IntVar(&c.RedisNice, "redis-nice", 0, "the private Redis's scheduling priority (nice, -20 to 19; below 0 needs root), 0 to leave it: a fleet's nodes and workers sharing the machine's cores with Redis starve it, where in production it has a machine of its own; -10 stands in for that (one redis-server; not with -cluster)")
	fs.StringVar(&c.ServerBin, "server-bin", "", "a pushd binary to run instead of building one")
	fs.StringVar(&c.ServerSrc, "server-src", "head", "what to build pushd from: head (the committed tree, via git archive), a git revision, or worktree (the working tree, with whatever is uncommitted)")
	fs.StringVar(&c.Repo, "repo", "", "the pushd repository (default: the module root of the current directory)")
	serverArgs := fs.String("server-args", "", "extra pushd flags, space-separated (they win over the loadtest's own)")
	serverEnv := fs.String("server-env", "", "extra environment of the server under test (pushd or Centrifugo), KEY=VAL,KEY=VAL (GOMAXPROCS, GOGC, GOMEMLIMIT, ...)")
	fs.StringVar(&c.CentrifugoBin, "centrifugo-bin", "", "a Centrifugo 6.9.1 binary for -target centrifugo or both: build Centrifugo 6.9.1 yourself and pass its path")
	fs.StringVar(&c.Out, "out", "", "write the JSON result here (with -quick, -find-max or -target both: a JSON array of every run)")
	fs.BoolVar(&c.Verbose, "v", false, "log progress to stderr")
	fs.StringVar(&c.ProfileWorkers, "profile-workers", "", "write each worker's CPU profile, and its heap in use when it reports, to this directory (the heap profile forces a GC and samples every 512 bytes allocated: a profiled run's figures are not comparable)")
	fs.StringVar(&c.ProfileNodes, "profile-nodes", "", "give each pushd node a debug listener and write CPU profiles of it to this directory: with -kill-node, each surviving node's over the 10 s after the kill; otherwise, in fanout, each node's over the publishing (node<i>.measure.pprof), and perf's samples of the split (pushd.measure.perf, centrifugo.measure.perf; -cpu-split)")
	fs.Bool("worker", false, "run as a worker (internal)")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: loadtest -scenario idle|fanout|churn|storm|outage|stall [-transport sse|ws] [flags]\n       loadtest -quick\n\n")
		fs.VisitAll(func(f *flag.Flag) {
			if f.Name == "worker" {
				return
			}
			fmt.Fprintf(fs.Output(), "  -%s\n    \t%s", f.Name, f.Usage)
			if f.DefValue != "" && f.DefValue != "0" && f.DefValue != "0s" && f.DefValue != "false" {
				fmt.Fprintf(fs.Output(), " (default %q)", f.DefValue)
			}
			fmt.Fprintln(fs.Output())
		})
	}
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	if fs.NArg() > 0 {
		return c, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if c.Quick && !set["transport"] {
		c.Transport = ""
	}
	// Zero is a count of its own here: unset takes the scenario's default.
	if !set["stalled-sse"] {
		c.StalledSSE = -1
	}
	if !set["stalled-ws"] {
		c.StalledWS = -1
	}
	if !set["tenants"] {
		c.Tenants = 0
	}
	c.ServerArgs = strings.Fields(*serverArgs)
	for kv := range strings.SplitSeq(*serverEnv, ",") {
		if kv = strings.TrimSpace(kv); kv != "" {
			if !strings.Contains(kv, "=") {
				return c, fmt.Errorf("-server-env: %q is not KEY=VAL", kv)
			}
			c.ServerEnv = append(c.ServerEnv, kv)
		}
	}
	if c.Scenario == "" && !c.Quick {
		return c, fmt.Errorf("-scenario is required (idle, fanout, churn, storm, outage, stall, repair), or -quick")
	}
	if c.Scenario != "" && !validScenario(c.Scenario) {
		return c, fmt.Errorf("-scenario %q: want one of %s", c.Scenario, strings.Join(scenarios, ", "))
	}
	if err := c.checkCluster(); err != nil {
		return c, err
	}
	if set["nodes"] && c.Nodes < 1 {
		return c, fmt.Errorf("-nodes %d: want 1 or more", c.Nodes)
	}
	if err := c.checkNodes(); err != nil {
		return c, err
	}
	if err := c.checkRestarts(); err != nil {
		return c, err
	}
	if err := c.checkLimits(); err != nil {
		return c, err
	}
	if c.Hold < 0 || (c.Hold > 0 && c.Scenario != "idle") {
		return c, fmt.Errorf("-hold needs -scenario idle and a positive duration")
	}
	if c.StormResume && (c.Scenario != "storm" || c.Cluster) {
		return c, fmt.Errorf("-storm-resume needs -scenario storm, without -cluster")
	}
	if set["storm-moved"] && !c.StormResume {
		return c, fmt.Errorf("-storm-moved needs -storm-resume")
	}
	if c.StormResume && (c.StormMoved <= 0 || c.StormMoved > 1) {
		return c, fmt.Errorf("-storm-moved %v: want a share above 0, at most 1", c.StormMoved)
	}
	switch {
	case c.Transport == "mixed" && (c.Quick || (c.Scenario != "idle" && c.Scenario != "fanout")):
		return c, fmt.Errorf("-transport mixed runs -scenario idle or fanout, without -quick")
	case c.Transport != "" && c.Transport != "sse" && c.Transport != "ws" && c.Transport != "mixed":
		return c, fmt.Errorf("-transport %q: want sse, ws or mixed", c.Transport)
	}
	if err := c.checkTarget(); err != nil {
		return c, err
	}
	if c.FindMax && (c.Quick || c.Scenario != "fanout" || c.KillMaster) {
		return c, fmt.Errorf("-find-max runs -scenario fanout only, without -quick or -kill-master")
	}
	if c.CPUSplit != "auto" && c.CPUSplit != "perf" && c.CPUSplit != "proc" {
		return c, fmt.Errorf("-cpu-split %q: want auto, perf or proc", c.CPUSplit)
	}
	switch c.PGWrites {
	case "auto", "always", "fallback", "off":
	case "only":
		if c.Target != "pushd" || c.Scenario != "fanout" {
			return c, fmt.Errorf("-pg-writes only: -scenario fanout with -target pushd (the nodes read the rows' changes)")
		}
	default:
		return c, fmt.Errorf("-pg-writes %q: want auto, always, fallback, only or off", c.PGWrites)
	}
	if c.RedisNice < -20 || c.RedisNice > 19 || (c.RedisNice != 0 && c.Cluster) {
		return c, fmt.Errorf("-redis-nice %d: want -20 to 19, on one redis-server (not -cluster)", c.RedisNice)
	}
	if c.LatencyFrom != "due" && c.LatencyFrom != "write" {
		return c, fmt.Errorf("-latency-from %q: want due or write", c.LatencyFrom)
	}
	if c.ServerSrc == "" {
		return c, fmt.Errorf("-server-src: want head, worktree or a git revision")
	}
	if c.PerWorker <= 0 || c.Ramp <= 0 || c.Sources <= 0 || c.Sources > 250 || c.Publishers <= 0 || c.PubEvery <= 0 || (set["tenants"] && c.Tenants <= 0) {
		return c, fmt.Errorf("-per-worker, -ramp, -publishers and -tenants must be positive, -sources 1 to 250")
	}
	if set["snapshot-bytes"] && (c.SnapshotBytes < 0 || c.SnapshotBytes > snapshot.MaxSize) {
		return c, fmt.Errorf("-snapshot-bytes %d: want 1 to %d", c.SnapshotBytes, snapshot.MaxSize)
	}
	c.Command = commandLine(args)
	return c, nil
}

// centrifugoScenarios are the scenarios that can run against Centrifugo:
// the others restart the node, kill Redis or read PostgreSQL, which are
// pushd's promises, not Centrifugo's.
var centrifugoScenarios = []string{"idle", "fanout"}

func (c config) checkTarget() error {
	switch c.Target {
	case "pushd":
		return nil
	case "centrifugo", "both":
	default:
		return fmt.Errorf("-target %q: want pushd, centrifugo or both", c.Target)
	}
	if c.Quick || !slices.Contains(centrifugoScenarios, c.Scenario) {
		return fmt.Errorf("-target %s: only -scenario fanout and idle run against Centrifugo", c.Target)
	}
	if c.Cluster {
		return fmt.Errorf("-target %s: -cluster measures a fleet of pushd nodes only", c.Target)
	}
	if c.CentrifugoBin == "" {
		return fmt.Errorf("-target %s needs -centrifugo-bin (build Centrifugo 6.9.1 yourself and pass its path)", c.Target)
	}
	return nil
}

// clusterScenarios are the scenarios -cluster runs.
var clusterScenarios = []string{"idle", "fanout", "storm"}

func (c config) checkCluster() error {
	if c.KillMaster && (!c.Cluster || (c.Scenario != "fanout" && !c.Quick)) {
		return fmt.Errorf("-kill-master needs -cluster and -scenario fanout")
	}
	if c.Cluster && c.Scenario != "" && !slices.Contains(clusterScenarios, c.Scenario) {
		return fmt.Errorf("-cluster runs %s, not %s", strings.Join(clusterScenarios, ", "), c.Scenario)
	}
	return nil
}

// multiNodeScenarios are the scenarios that run on several nodes without
// -cluster: the others restart one node, kill its Redis, pin stalled
// clients to node 0 or count resumes of one node.
var multiNodeScenarios = []string{"idle", "fanout", "churn", "storm"}

// nodeCount is how many pushd nodes the run starts.
func (c config) nodeCount() int {
	switch {
	case c.Nodes > 0:
		return c.Nodes
	case c.Cluster:
		return clusterMasters
	}
	return 1
}

func (c config) checkNodes() error {
	if c.Nodes <= 1 {
		return nil
	}
	if c.Target != "pushd" && c.Target != "" {
		return fmt.Errorf("-nodes %d: -target %s runs one node", c.Nodes, c.Target)
	}
	if c.StormResume {
		return fmt.Errorf("-nodes %d: -storm-resume runs on one node", c.Nodes)
	}
	if !c.Cluster && c.Scenario != "" && !slices.Contains(multiNodeScenarios, c.Scenario) {
		return fmt.Errorf("-nodes %d runs %s, not %s", c.Nodes, strings.Join(multiNodeScenarios, ", "), c.Scenario)
	}
	return nil
}

// checkRestarts checks -kill-node and -roll: fanout on a fleet whose other
// nodes take the stopped node's clients, one of them at a time.
func (c config) checkRestarts() error {
	name := "-kill-node"
	switch {
	case c.KillNode && c.Roll:
		return fmt.Errorf("-kill-node and -roll: choose one")
	case c.Roll:
		name = "-roll"
	case !c.KillNode:
		return nil
	}
	switch {
	case c.Scenario != "fanout":
		return fmt.Errorf("%s runs -scenario fanout only", name)
	case c.nodeCount() < 2:
		return fmt.Errorf("%s needs -nodes 2 or more: the other nodes take the stopped node's clients", name)
	case c.KillMaster:
		return fmt.Errorf("%s and -kill-master: one failure a run", name)
	case c.FindMax:
		return fmt.Errorf("%s measures one rate: not with -find-max", name)
	case c.PingFlooders > 0:
		return fmt.Errorf("%s: not with -ping-flooders, which dial node 0", name)
	}
	return nil
}

// limitsScenarios are the scenarios -limits production runs: the others
// reconnect every client at once or count refusals a production limit
// would add to.
var limitsScenarios = []string{"idle", "fanout"}

// maxConnsPerTenant is pushd's --max-conns-per-tenant default, which
// -limits production keeps.
const maxConnsPerTenant = 10000

func (c config) checkLimits() error {
	switch c.Limits {
	case "off", "":
		return nil
	case "production":
	default:
		return fmt.Errorf("-limits %q: want off or production", c.Limits)
	}
	if c.Quick || !slices.Contains(limitsScenarios, c.Scenario) {
		return fmt.Errorf("-limits production runs -scenario %s only", strings.Join(limitsScenarios, " or "))
	}
	if c.Target != "pushd" {
		return fmt.Errorf("-limits production: -target %s: the limits are pushd's", c.Target)
	}
	d := c.withDefaults()
	if per := (d.Conns + d.Tenants - 1) / d.Tenants; per > maxConnsPerTenant {
		return fmt.Errorf("-limits production keeps pushd's cap of %d connections per tenant: %d connections over %d tenants put %d on one; raise -tenants to %d or more",
			maxConnsPerTenant, d.Conns, d.Tenants, per, (d.Conns+maxConnsPerTenant-1)/maxConnsPerTenant)
	}
	return nil
}

// production reports whether pushd runs with the production admission
// limits (-limits production).
func (c config) production() bool { return c.Limits == "production" }

// limitsEnv is pushd's environment for c.Limits: the limits -limits off
// turns off, or the per-address ones -limits production sizes for
// c.Sources addresses standing for many clients, and the fleet's size.
// Environment, not flags, so servers built from commits older than the
// flags still start.
func (c config) limitsEnv() []string {
	if !c.production() {
		// Admission limits are for browsers, and the load generator is a
		// few users on 16 addresses opening thousands of connections a
		// second: off unless -server-env sets them, the failed-
		// authentication bucket per address too (a server that counts
		// every authentication against it would otherwise let 20
		// connections per address in).
		return []string{"PUSHD_CONNECT_IP_BURST=0", "PUSHD_CONNECT_USER_BURST=0",
			"PUSHD_MAX_CONNS_PER_USER=0", "PUSHD_MAX_CONNS_PER_TENANT=0", "PUSHD_API_LIMIT_FREE=0", "PUSHD_MAX_CONNS_PER_IP=0",
			"PUSHD_AUTH_FAILURE_BURST=0"}
	}
	perIP, ipRate, ipBurst := c.addressLimits()
	return []string{
		"PUSHD_MAX_CONNS_PER_IP=" + strconv.Itoa(perIP),
		"PUSHD_CONNECT_IP_RATE=" + strconv.Itoa(ipRate),
		"PUSHD_CONNECT_IP_BURST=" + strconv.Itoa(ipBurst),
		"PUSHD_EXPECTED_NODES=" + strconv.Itoa(c.nodeCount()),
	}
}

// addressLimits are -limits production's per-address settings: a stream
// cap a quarter above the clients one source address holds (on one node
// when the node count divides -sources), and a connect bucket refilling
// at twice the ramp's share of an address, so the first attempts that
// fail and retry fit too, holding a second of that; never below pushd's
// defaults (5,000 streams, 20/s, 200).
func (c config) addressLimits() (perIP, ipRate, ipBurst int) {
	perIP = max(5000, int(math.Ceil(1.25*float64(c.Conns)/float64(c.Sources))))
	ipRate = max(20, int(math.Ceil(2*c.Ramp/float64(c.Sources))))
	return perIP, ipRate, max(200, ipRate)
}

func validScenario(s string) bool {
	for _, v := range scenarios {
		if v == s {
			return true
		}
	}
	return false
}

// withDefaults fills the scenario's defaults into what the flags left zero.
func (c config) withDefaults() config {
	type defaults struct {
		conns, tasks int
		rate, churn  float64
		stalled      int // stalled SSE clients, and as many WebSocket ones
	}
	full := map[string]defaults{
		"idle":   {15000, 0, 0, 0, 0},
		"fanout": {10000, 1000, 1000, 0, 0},
		"churn":  {2000, 1000, 200, 200, 0},
		"storm":  {10000, 1000, 0, 0, 0},
		"outage": {2000, 500, 200, 0, 0},
		"stall":  {1000, 100, 100, 0, 200},
		"repair": {10000, 0, 0, 0, 0},
	}
	quick := map[string]defaults{
		"idle":   {200, 0, 0, 0, 0},
		"fanout": {200, 20, 100, 0, 0},
		"churn":  {200, 50, 50, 40, 0},
		"storm":  {200, 20, 0, 0, 0},
		"outage": {200, 20, 50, 0, 0},
		"stall":  {40, 10, 100, 0, 16},
		"repair": {200, 0, 0, 0, 0},
	}
	d := full[c.Scenario]
	if c.Quick {
		d = quick[c.Scenario]
	}
	if c.Conns <= 0 {
		c.Conns = d.conns
	}
	if c.Tasks <= 0 {
		c.Tasks = d.tasks
		if c.Tasks == 0 || c.Tasks > c.Conns {
			c.Tasks = c.Conns
		}
	}
	if c.Rate <= 0 {
		c.Rate = d.rate
	}
	if c.ChurnRate <= 0 {
		c.ChurnRate = d.churn
	}
	if c.StalledSSE < 0 {
		c.StalledSSE = d.stalled
	}
	if c.StalledWS < 0 {
		c.StalledWS = d.stalled
	}
	if c.Tenants <= 0 {
		c.Tenants = 10
		if c.Scenario == "stall" {
			// One tenant: a stalled client can watch only its tenant's
			// tasks, and so it watches all of them.
			c.Tenants = 1
		}
	}
	if c.SnapshotBytes <= 0 && c.Scenario == "stall" {
		c.SnapshotBytes = 30000
	}
	if c.Scenario == "stall" {
		c.Transport = "sse+ws"
	}
	if c.Duration <= 0 {
		c.Duration = 20 * time.Second
		switch {
		case c.Quick:
			c.Duration = 5 * time.Second
		case c.Scenario == "repair":
			c.Duration = time.Minute
		}
	}
	if c.StormResume && c.StormMoved <= 0 {
		c.StormMoved = 0.1
	}
	if c.Scenario == "repair" && c.Quick && c.RepairInterval <= 0 {
		c.RepairInterval = time.Second
	}
	if c.Quick && c.Outage == 5*time.Second {
		c.Outage = 2 * time.Second
	}
	if c.PubEvery <= 0 {
		c.PubEvery = time.Millisecond
	}
	if c.Workers <= 0 {
		c.Workers = (c.Conns + c.PerWorker - 1) / c.PerWorker
	}
	if c.Workers < 1 {
		c.Workers = 1
	}
	if c.Target == "" {
		c.Target = "pushd"
	}
	if c.Limits == "" {
		c.Limits = "off"
	}
	if c.Target == "centrifugo" {
		// Centrifugo reads no PostgreSQL: its publisher writes only to it.
		c.PGWrites = "off"
	}
	if c.PGWrites == "auto" {
		// pushd reads PostgreSQL, the fact source, whenever Redis answers
		// older than a notification announced (a read that raced the
		// write): a publisher that leaves the rows behind Redis can leave
		// watchers stale, which the convergence check reports.
		c.PGWrites = "always"
		if c.Scenario == "idle" || c.Scenario == "repair" {
			c.PGWrites = "off"
		}
	}
	return c
}

// commandLine is how the run was started, for the result and the table.
func commandLine(args []string) string {
	name := "go run ./loadtest"
	if exe, err := os.Executable(); err == nil && !strings.Contains(exe, "go-build") {
		name = "loadtest"
	}
	parts := []string{name}
	for _, a := range args {
		if strings.ContainsAny(a, " \t'\"") {
			a = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
		}
		parts = append(parts, a)
	}
	return strings.Join(parts, " ")
}

// serverCPUs and loadCPUs are where -pin runs the server under test and
// everything else; "" without -pin.
func (c config) serverCPUs() string {
	if c.Pin {
		return serverCPU
	}
	return ""
}

func (c config) loadCPUs() string {
	if c.Pin {
		return loadCPU
	}
	return ""
}

// serverEnv is the environment of the server under test: -server-env's,
// with GOMAXPROCS=1 under -pin unless it sets one.
func (c config) serverEnv() []string {
	if !c.Pin || slices.ContainsFunc(c.ServerEnv, func(kv string) bool { return strings.HasPrefix(kv, "GOMAXPROCS=") }) {
		return c.ServerEnv
	}
	return append(slices.Clip(c.ServerEnv), "GOMAXPROCS=1")
}
