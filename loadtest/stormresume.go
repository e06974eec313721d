package main

import (
	"cmp"
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"time"
)

// pushdRepairInterval is pushd's --repair-interval when a run sets none.
const pushdRepairInterval = 10 * time.Second

// pushdStreamMaxLen is pushd's default --stream-maxlen: the publisher trims
// the streams it appends to as the nodes do.
const pushdStreamMaxLen = 10000

// runStormResume is the storm of clients that come back with what they
// hold: the node runs with --streams, Redis keeps everything, every task
// changes in the seconds before the node stops, and a share of them
// (-storm-moved) while it is down. Clients resume from their stream cursor
// (SSE) or their version (WebSocket), and count the task events they get
// from their reconnect until two repair intervals after every one of them
// converged, with nothing published in that quiet window: ideally one
// event per client of a moved task and none else.
func runStormResume(ctx context.Context, r *run) error {
	cfg := r.cfg
	if err := r.connectAll(ctx); err != nil {
		return err
	}
	// Active tasks: every one changes just before the stop, so each
	// client's cursor was issued moments after its task's updated_at, which
	// is what a repair round weighs when it decides whether a resumed
	// client may lack a task the stream did not replay.
	if err := r.phase(ctx, "warm"); err != nil {
		return err
	}
	rate := cfg.Rate
	if rate <= 0 {
		rate = float64(cfg.Tasks) / 2 // each task every 2 s
	}
	pr := r.pub.run(ctx, rate, time.Duration(2*float64(cfg.Tasks)/rate*float64(time.Second)))
	r.res.Publish, r.res.Rate = &pr, rate
	conv, live, _, err := r.converge(ctx, r.pub.lastVersions(), cfg.Settle)
	if err != nil {
		return err
	}
	if conv < live {
		return fmt.Errorf("only %d of %d clients held their task's last version before the stop", conv, live)
	}
	// Before the stop: what each connection holds now is what a resend
	// would repeat.
	if _, err := r.all(ctx, func(int) command { return command{Cmd: "hold"} }, "holding", 10*time.Second); err != nil {
		return err
	}
	if err := r.phase(ctx, "storm"); err != nil {
		return err
	}
	stopping := time.Now()
	r.res.fig("last_update_age_s", stopping.Sub(time.Unix(0, r.pub.lastStored.Load())).Seconds(), "s", false)
	r.nodes.stop(30 * time.Second)
	r.logf("server stopped after %v", time.Since(stopping).Round(time.Millisecond))
	r.res.fig("drain_s", time.Since(stopping).Seconds(), "s", false)

	// The Task State Service moves some tasks while the node is down: the
	// row, the snapshot and the stream entry, as it always does.
	moved := movedTasks(cfg.Tasks, cfg.StormMoved)
	stored := r.pub.stats().Stored
	r.pub.publishSet(ctx, moved)
	if s := r.pub.stats(); s.Stored-stored != int64(len(moved)) {
		return fmt.Errorf("moving %d tasks: %s (%s)", len(moved), s, s.LastError)
	}
	r.res.fig("moved_tasks", float64(len(moved)), "", false)
	r.res.fig("events_per_client_ideal", float64(watchersOf(moved, cfg.Conns, cfg.Tasks))/float64(cfg.Conns), "", true)
	if err := r.expect(r.pub.lastVersions()); err != nil {
		return err
	}
	up, err := r.nodes.startAccepting(ctx)
	if err != nil {
		return err
	}
	if err := r.broadcast(command{Cmd: "wake", JitterNs: int64(cfg.StormJitter)}); err != nil {
		return err
	}
	conv, live, at, err := r.waitConverged(ctx, max(cfg.Settle, 30*time.Second))
	if err != nil {
		return err
	}
	if conv == live {
		r.res.fig("converge_s", at.Sub(up).Seconds(), "s", true)
	} else {
		r.res.warn("storm: %d of %d clients converged", conv, live)
	}
	// A client of a task that did not move counts as converged before it
	// reconnects: the window starts once every one has.
	back, err := r.waitReconnected(ctx, max(cfg.Settle, 30*time.Second))
	if err != nil {
		return err
	}
	if back.Reopened == back.Conns {
		r.res.fig("reconnect_all_s", time.Unix(0, back.LastReopenNs).Sub(up).Seconds(), "s", false)
	}

	// The quiet window: nothing is published, so whatever a client is
	// sent now it already holds. Two intervals hold at least one whole
	// repair round, wherever the wall-clock slots fall. (A round offers
	// what Redis holds, and a running task's snapshot expires there 10 s
	// after its last write: with pushd's 10 s interval the round may find
	// none.)
	interval := cmp.Or(cfg.RepairInterval, pushdRepairInterval)
	m0 := r.scrape(ctx)
	quietFrom := time.Now()
	if _, err := r.all(ctx, func(int) command { return command{Cmd: "quiet", RefNs: quietFrom.UnixNano()} }, "quieted", 10*time.Second); err != nil {
		return err
	}
	if err := sleepCtx(ctx, 2*interval); err != nil {
		return err
	}
	m1 := r.scrape(ctx)
	h, err := r.held(ctx)
	if err != nil {
		return err
	}
	if h.Reopened < h.Conns {
		r.res.warn("storm: %d of %d clients reconnected", h.Reopened, h.Conns)
	}
	r.res.fig("reconnected", float64(h.Reopened), "", false)
	r.res.fig("events_per_client_after_resume", float64(h.Events)/float64(max(h.Reopened, 1)), "", true)
	r.res.fig("resent_unchanged", float64(h.Resent), "", true)
	r.res.fig("clients_resent_unchanged", float64(h.ResentConns), "", false)
	r.res.fig("quiet_window_events", float64(h.Quiet), "", false)
	r.res.fig("quiet_window_s", time.Since(quietFrom).Seconds(), "s", false)
	// The node restarted: its counters count from then. pushd_repairs_total
	// counts tasks, not connections.
	r.res.fig("repairs_quiet_window", sumSeries(m1, "pushd_repairs_total")-sumSeries(m0, "pushd_repairs_total"), "", true)
	for _, found := range []string{"database_newer", "redis_newer", "not_held"} {
		series := `pushd_repairs_total{found="` + found + `"}`
		r.res.fig("repairs_quiet_window_"+found, m1[series]-m0[series], "", false)
	}
	r.res.fig("repairs_since_restart", sumSeries(m1, "pushd_repairs_total"), "", false)
	r.res.fig("repair_rounds_since_restart", m1["pushd_repair_rounds_total"], "", false)
	r.res.fig("stream_resumes", m1["pushd_resumes_total"], "", false)
	// What the replays read before the cursors to learn what each client
	// holds (0 from a node before that read).
	r.res.fig("held_entries_per_resume", m1["pushd_resume_held_entries_total"]/max(m1["pushd_resumes_total"], 1), "", false)
	r.res.fig("resume_fallbacks", sumSeries(m1, "pushd_resume_fallbacks_total"), "", false)
	// Tasks the replays sent: one per client of a moved task, and one per
	// client whose cursor was older than its task's last entry.
	r.res.fig("resume_tasks_sent", m1["pushd_resume_tasks_total"], "", false)

	m, err := r.final(ctx)
	if err != nil {
		return err
	}
	// Clients told a read failed are read everything again, as new ones.
	// (No reconnect latency, as the storm reports: a client of a task that
	// did not move has no first snapshot to time unless it is resent one.)
	r.res.fig("unavailable_errors", float64(m.Errors["error_event_unavailable"]+m.Errors["rejected_unavailable"]), "", false)
	return nil
}

// held is what every connection received since the hold mark.
func (r *run) held(ctx context.Context) (*holdReport, error) {
	replies, err := r.all(ctx, func(int) command { return command{Cmd: "held"} }, "held", 30*time.Second)
	if err != nil {
		return nil, err
	}
	h := &holdReport{}
	for _, rp := range replies {
		if rp.Held != nil {
			h.add(rp.Held)
		}
	}
	return h, nil
}

// waitReconnected asks the workers every 100 ms until every connection
// counting since the hold mark connected again, or timeout; it returns
// the last answer, which says how many did.
func (r *run) waitReconnected(ctx context.Context, timeout time.Duration) (*holdReport, error) {
	deadline := time.Now().Add(timeout)
	for {
		h, err := r.held(ctx)
		if err != nil || h.Reopened >= h.Conns || time.Now().After(deadline) {
			return h, err
		}
		if err := sleepCtx(ctx, 100*time.Millisecond); err != nil { // polling the workers, not synchronization
			return nil, err
		}
	}
}

// movedTasks is round(share × tasks) of the tasks, at least one, picked at
// random but the same for a given count: spread over the tenants, which
// every tenth task would not be with ten of them.
func movedTasks(tasks int, share float64) []int {
	n := min(tasks, max(1, int(math.Round(share*float64(tasks)))))
	ids := rand.New(rand.NewPCG(uint64(tasks), 1)).Perm(tasks)[:n]
	slices.Sort(ids)
	return ids
}

// watchersOf is how many of conns connections watch one of tasks:
// connection i watches task i mod n.
func watchersOf(tasks []int, conns, n int) int {
	w := 0
	for _, t := range tasks {
		w += conns / n
		if t < conns%n {
			w++
		}
	}
	return w
}

// sumSeries adds up a series over its labels.
func sumSeries(m metrics, name string) float64 {
	var v float64
	for k, x := range m {
		if k == name || strings.HasPrefix(k, name+"{") {
			v += x
		}
	}
	return v
}
