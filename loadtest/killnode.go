package main

import (
	"context"
	"fmt"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
)

// nodeKill is what fanout with -kill-node did: when it killed node 0, the
// connections node 0 held then, and the surviving nodes' PostgreSQL
// queries at the kill and once the publishing ended.
type nodeKill struct {
	at          time.Time
	conns       float64
	pgAt, pgEnd float64
	pgRead      bool // pgEnd was read: every surviving node answered
	// The publisher's waits (waitWindow) before the kill and after it.
	waitBefore, waitMove *hdrhistogram.Histogram
}

// publishKillingNode publishes as fanout does and, halfway through,
// SIGKILLs node 0. Its clients find it refusing and dial the other nodes,
// as behind a balancer, while the publishing goes on. Once the publishing
// ends node 0 starts again, empty, so that the rest of the run reads
// every node.
func (r *run) publishKillingNode(ctx context.Context) (pubRun, *nodeKill, error) {
	done := make(chan pubRun, 1)
	go func() { done <- r.pub.run(ctx, r.cfg.Rate, r.cfg.Duration) }()
	if err := sleepCtx(ctx, r.cfg.Duration/2); err != nil {
		return <-done, nil, err
	}
	each, err := r.nodes.scrapeEach(ctx)
	if err != nil {
		return <-done, nil, err
	}
	k := &nodeKill{conns: each[0]["pushd_connections"], pgAt: pgQueries(each[1:])}
	// The mark first: a physical connection dialed after it is one the
	// kill moved. The phase's reply comes after the mark's, so every
	// worker holds it when the node dies.
	if err := r.broadcast(command{Cmd: "since", RefNs: time.Now().UnixNano()}); err != nil {
		return <-done, nil, err
	}
	if err := r.phase(ctx, "move"); err != nil {
		return <-done, nil, err
	}
	k.at = time.Now()
	k.waitBefore = r.pub.waitWindow()
	r.endNode(0, r.nodes[0].kill)
	r.logf("killed node 0, which held %v connections", k.conns)
	if r.cfg.ProfileNodes != "" {
		survivors := make([]int, 0, len(r.nodes)-1)
		for i := 1; i < len(r.nodes); i++ {
			survivors = append(survivors, i)
		}
		r.profileNodes(ctx, survivors, "move", min(10*time.Second, r.cfg.Duration/2))
	}
	pr := <-done
	k.waitMove = r.pub.waitWindow()
	if each, err := r.nodes[1:].scrapeEach(ctx); err != nil {
		r.res.warn("kill-node: the surviving nodes' PostgreSQL queries at the end: %v", err)
	} else {
		k.pgEnd, k.pgRead = pgQueries(each), true
	}
	if _, err := r.nodes[0].startAccepting(ctx); err != nil {
		return pr, nil, fmt.Errorf("restart node 0 after the kill: %w", err)
	}
	return pr, k, nil
}

// pgQueries is the PostgreSQL queries the nodes scraped sent, summed.
func pgQueries(each []metrics) float64 {
	var n float64
	for _, m := range each {
		n += m["pushd_postgres_queries_total"]
	}
	return n
}

// endNode ends node i's process with end (a kill, or a stop with its
// drain) and keeps the CPU time it used, which r.mark adds to the node's
// next process's: the server's CPU over a run that restarts a node.
func (r *run) endNode(i int, end func()) {
	p := r.nodes[i].current()
	end()
	if p == nil || !p.exited() || p.cmd.ProcessState == nil {
		return
	}
	if r.endedCPU == nil {
		r.endedCPU = make([]int64, len(r.nodes))
	}
	ps := p.cmd.ProcessState
	r.endedCPU[i] += int64((ps.UserTime() + ps.SystemTime()).Seconds() * clockTicks)
}

// reportNodeKill reports, once every client converged, how the clients of
// the killed node came back: how many received a task event on a physical
// connection dialed after the kill's mark and how long after the kill the
// last of them did; the surviving nodes' latency while they took them
// (phase move), node by node; and the PostgreSQL reads the move cost them
// per task the moved clients watch. A run where fewer clients came back
// than node 0 held fails, when the half after the kill updated every task.
func (r *run) reportNodeKill(ctx context.Context, k *nodeKill, m *merged) error {
	replies, err := r.all(ctx, func(int) command { return command{Cmd: "moved", RefNs: k.at.UnixNano()} }, "moved", 30*time.Second)
	if err != nil {
		return err
	}
	var back movedReport
	for _, rp := range replies {
		if rp.Moved != nil {
			back.Conns += rp.Moved.Conns
			back.MaxNs = max(back.MaxNs, rp.Moved.MaxNs)
		}
	}
	backS := float64(back.MaxNs) / 1e9
	r.res.fig("node_kill_conns", k.conns, "", true)
	r.res.fig("node_kill_back_conns", float64(back.Conns), "", false)
	r.res.fig("node_kill_back_s", backS, "s", true)
	// A moved client's first event on its new node may wait for its
	// task's next update: each task needs one after the kill.
	everyTask := r.cfg.Rate*r.cfg.Duration.Seconds()/2 >= float64(r.cfg.Tasks)
	switch missing := k.conns - float64(back.Conns); {
	case missing > 0 && everyTask:
		r.res.fail("KILL-NODE: %v of the %v clients node 0 held received no task event on another node", missing, k.conns)
	case missing > 0:
		r.res.warn("kill-node: %v of the %v clients node 0 held received no task event on another node; the half after the kill did not update every task", missing, k.conns)
	}
	if backS > 10 {
		r.res.warn("kill-node: the last moved client received its first event %.1f s after the kill", backS)
	}
	// The same nodes before the kill, beside the move: what the move
	// added, and what the load was already costing.
	if r.res.PerNode == nil {
		r.res.PerNode = map[string][]float64{}
	}
	for _, ph := range []struct{ name, fig string }{{"measure", "before_kill"}, {"move", "move"}} {
		byNode := m.phase(ph.name).ByNode
		perNode := make([]float64, len(r.nodes)) // node 0's stays 0: it died
		var most float64
		for i := 1; i < len(r.nodes) && i < len(byNode); i++ {
			if h := byNode[i]; h != nil {
				perNode[i] = float64(h.ValueAtQuantile(99)) / 1000
				most = max(most, perNode[i])
			}
		}
		r.res.PerNode[ph.fig+"_p99_ms"] = perNode
		r.res.fig(ph.fig+"_p99_ms_other_max", most, "ms", ph.name == "move")
	}
	// What of those latencies the publisher's own queue was: an update
	// waits behind its goroutine's earlier publishes when the machine is
	// too busy for the writes to keep the rate.
	for _, w := range []struct {
		fig string
		h   *hdrhistogram.Histogram
	}{{"before_kill", k.waitBefore}, {"move", k.waitMove}} {
		if w.h != nil {
			r.res.fig(w.fig+"_publish_wait_p99_ms", float64(w.h.ValueAtQuantile(99))/1000, "ms", false)
		}
	}
	if n := r.tasksOnNode(0); k.pgRead && n > 0 {
		r.res.fig("move_pg_reads_per_task", (k.pgEnd-k.pgAt)/float64(n), "/task", true)
	}
	return nil
}

// tasksOnNode is how many distinct tasks the connections that first dial
// node i watch: connection c dials node c mod nodes and watches task c
// mod tasks.
func (r *run) tasksOnNode(i int) int {
	seen := map[int]bool{}
	for c := i; c < r.cfg.Conns; c += len(r.nodes) {
		seen[c%r.cfg.Tasks] = true
	}
	return len(seen)
}

// movedReport is a worker's connections that received a task event on a
// physical connection dialed after the since mark, and the longest wait
// for the first of them after the moved command's RefNs.
type movedReport struct {
	Conns int   `json:"conns"`
	MaxNs int64 `json:"max_ns"`
}

func (w *worker) moved(ref int64) *movedReport {
	r := &movedReport{}
	for _, c := range w.snapshotConns() {
		if at := c.back.Load(); at != 0 {
			r.Conns++
			r.MaxNs = max(r.MaxNs, at-ref)
		}
	}
	return r
}

// nodeRoll is -roll's restart of every node in turn: how long it took,
// and the longest stop and start of one node.
type nodeRoll struct {
	took, longest time.Duration
}

// publishRolling publishes as fanout does and, from a quarter of
// -duration on, restarts every node in turn as a rolling deploy does:
// SIGTERM, its drain (up to 30 s), a new process, and the next node once
// it accepts connections. A drained node's clients dial the others. The
// publishing lasts -duration, or until 2 s after the roll if that is
// later, so that every restart happens under load.
func (r *run) publishRolling(ctx context.Context) (pubRun, *nodeRoll, error) {
	stop := make(chan struct{})
	done := make(chan pubRun, 1)
	// A bound stop always comes before: 30 s of drain and 30 s of start
	// a node at most.
	bound := r.cfg.Duration + time.Duration(len(r.nodes))*time.Minute
	start := time.Now()
	go func() { done <- r.pub.runUntil(ctx, stop, r.cfg.Rate, bound) }()
	roll, err := r.rollNodes(ctx, r.cfg.Duration/4)
	if err == nil {
		err = sleepCtx(ctx, max(r.cfg.Duration-time.Since(start), 2*time.Second))
	}
	close(stop)
	return <-done, roll, err
}

// rollNodes restarts every node in turn, after wait.
func (r *run) rollNodes(ctx context.Context, wait time.Duration) (*nodeRoll, error) {
	if err := sleepCtx(ctx, wait); err != nil {
		return nil, err
	}
	started := time.Now()
	roll := &nodeRoll{}
	for i, s := range r.nodes {
		t := time.Now()
		r.endNode(i, func() { s.stop(30 * time.Second) })
		if _, err := s.startAccepting(ctx); err != nil {
			return nil, fmt.Errorf("roll: restart node %d: %w", i, err)
		}
		roll.longest = max(roll.longest, time.Since(t))
		r.logf("rolled node %d in %v", i, time.Since(t).Round(time.Millisecond))
	}
	roll.took = time.Since(started)
	return roll, nil
}

func (r *run) reportRoll(roll *nodeRoll) {
	r.res.fig("roll_s", roll.took.Seconds(), "s", true)
	r.res.fig("roll_node_s_max", roll.longest.Seconds(), "s", true)
}
