package main

import (
	"fmt"
	"io"
	"os"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
)

// result is one run, written as JSON with -out and as a markdown row.
type result struct {
	Scenario   string  `json:"scenario"`
	Transport  string  `json:"transport"`
	Target     string  `json:"target"` // the server under test: pushd or centrifugo
	Conns      int     `json:"conns"`
	Tasks      int     `json:"tasks"`
	Tenants    int     `json:"tenants"`
	Workers    int     `json:"workers"`
	Rate       float64 `json:"rate,omitempty"`
	ChurnRate  float64 `json:"churn_rate,omitempty"`
	Duration   string  `json:"duration,omitempty"`
	Outage     string  `json:"outage,omitempty"`
	StalledSSE int     `json:"stalled_sse,omitempty"`
	StalledWS  int     `json:"stalled_ws,omitempty"`
	SnapBytes  int     `json:"snapshot_bytes,omitempty"`
	Quick      bool    `json:"quick,omitempty"`
	// Cluster: the pushd nodes run on a Redis Cluster of three masters
	// with a replica each. With several nodes, on a cluster or not, the
	// server's CPU and RSS are the nodes' sum, each node's in
	// cpu.server_cores_per_node, samples[].node_rss_kb and per_node.
	Cluster    bool `json:"cluster,omitempty"`
	Nodes      int  `json:"nodes"`
	KillMaster bool `json:"kill_master,omitempty"`
	// KillNode: node 0 was killed halfway through fanout's publishing;
	// Roll: every node was restarted in turn during it.
	KillNode bool `json:"kill_node,omitempty"`
	Roll     bool `json:"roll,omitempty"`
	// StormResume: the storm's clients resumed from their cursors (SSE) or
	// versions (WebSocket), StormMoved of the tasks moved meanwhile.
	StormResume bool    `json:"storm_resume,omitempty"`
	StormMoved  float64 `json:"storm_moved,omitempty"`
	// NodeConnections is each node's pushd_connections at the end, with
	// several nodes: clients go round-robin over them.
	NodeConnections []float64 `json:"node_connections,omitempty"`
	Commit          string    `json:"commit"`
	Command         string    `json:"command"`
	Started         string    `json:"started"`
	ElapsedSec      float64   `json:"elapsed_s"`
	Machine         machine   `json:"machine"`
	Server          struct {
		Args []string `json:"extra_args,omitempty"`
		Env  []string `json:"env,omitempty"`
	} `json:"server"`

	// Limits is "production" when pushd ran with its admission limits on
	// (-limits production); empty: off.
	Limits string `json:"limits,omitempty"`
	// Hold is how long idle held every connection before reading memory.
	Hold string `json:"hold,omitempty"`
	// PerNode is idle's per-connection figures node by node (each node's
	// RSS and goroutines after less before, over the connections it held),
	// and the connections each held when they were read.
	PerNode map[string][]float64 `json:"per_node,omitempty"`

	OK       bool     `json:"ok"`
	Problems []string `json:"problems,omitempty"` // what made it fail
	Warnings []string `json:"warnings,omitempty"`
	Notes    []string `json:"notes,omitempty"` // what a figure is made of

	Figures       []figure                   `json:"figures"`
	Latencies     map[string]*latencySummary `json:"latencies_ms,omitempty"`
	Convergence   *convergence               `json:"convergence,omitempty"`
	CPU           *cpuUse                    `json:"cpu,omitempty"`
	Publish       *pubRun                    `json:"publish,omitempty"`
	Publisher     *pubStats                  `json:"publisher,omitempty"`
	ClientCounts  map[string]int64           `json:"client_counts,omitempty"`
	ServerMetrics map[string]float64         `json:"server_metrics,omitempty"`
	Samples       []sample                   `json:"samples,omitempty"`
	KilledMaster  *killReport                `json:"killed_master,omitempty"`

	started time.Time
	inTable []string // figure names shown in the markdown row, in order
}

type machine struct {
	CPUs         int    `json:"cpus"`
	Model        string `json:"model"`
	MemGB        int    `json:"mem_gb"`
	Go           string `json:"go"`
	LoadAvgStart string `json:"loadavg_start"`
	LoadAvgEnd   string `json:"loadavg_end"`
	// BusyBeforePct is how busy the machine was in the half second before
	// the run started anything: other work sharing the cores.
	BusyBeforePct float64 `json:"busy_before_pct"`
}

// killReport is the master -kill-master killed: its address, the tenants
// whose channel it served, when (seconds into the run), and the
// connections by what the master held for them.
type killReport struct {
	Addr    string      `json:"addr"`
	Tenants []string    `json:"tenants"`
	AtS     float64     `json:"at_s"`
	Groups  []killGroup `json:"groups"`
}

// killGroup is the connections of one group (killed_shard: their tenant's
// channel was on the master; killed_keys: only their task's snapshot;
// untouched: neither): how many, how many received a snapshot published
// after the kill, and the longest wait for the first.
type killGroup struct {
	Name    string  `json:"name"`
	Conns   int     `json:"conns"`
	Resumed int     `json:"resumed"`
	ResumeS float64 `json:"resume_s"`
}

type figure struct {
	Name  string  `json:"name"`
	Value float64 `json:"value"`
	Unit  string  `json:"unit,omitempty"`
}

type latencySummary struct {
	Count int64   `json:"count"`
	P50   float64 `json:"p50"`
	P90   float64 `json:"p90"`
	P99   float64 `json:"p99"`
	P999  float64 `json:"p999"`
	Max   float64 `json:"max"`
	Mean  float64 `json:"mean"`
}

type convergence struct {
	Converged     int      `json:"converged"`
	Live          int      `json:"live"`
	Behind        int      `json:"behind"`
	Ahead         int      `json:"ahead"`
	NotConverged  []string `json:"not_converged,omitempty"`
	Regressions   int64    `json:"regressions"`
	RegressionEx  []string `json:"regression_examples,omitempty"`
	ResumeRepeats int64    `json:"resume_repeats"`
	Reconnects    int64    `json:"reconnects"`
	Errors        int64    `json:"errors"`
}

func newResult(cfg config, commit string) *result {
	r := &result{
		Scenario: cfg.Scenario, Transport: cfg.Transport, Target: cfg.Target, Conns: cfg.Conns, Tasks: cfg.Tasks, Tenants: cfg.Tenants,
		Workers: cfg.Workers, Quick: cfg.Quick, Cluster: cfg.Cluster, Nodes: 1, KillMaster: cfg.KillMaster, KillNode: cfg.KillNode, Roll: cfg.Roll, Commit: commit, Command: cfg.Command,
		started: time.Now(), Latencies: map[string]*latencySummary{},
	}
	r.Started = r.started.UTC().Format(time.RFC3339)
	r.Nodes = cfg.nodeCount()
	if cfg.production() {
		r.Limits = cfg.Limits
		if g := gcd(cfg.Tenants, r.Nodes); g > 1 {
			// Connection i is on node i mod nodes and of tenant i mod
			// tenants, as no balancer would place them.
			r.warn("-tenants %d and %d nodes share the factor %d: each node holds 1/%d of the tenants, %d times a tenant's even share, which a node's local share of the tenant cap (cap / nodes, while Redis is slow) refuses first; a tenant count prime to the node count spreads each tenant over every node",
				cfg.Tenants, r.Nodes, g, g, g)
		}
	}
	switch cfg.Scenario {
	case "fanout", "churn", "outage", "stall":
		r.Rate = cfg.Rate
		r.Duration = cfg.Duration.String()
	case "repair":
		r.Duration = cfg.Duration.String()
	}
	if cfg.Scenario == "stall" {
		r.StalledSSE, r.StalledWS = cfg.StalledSSE, cfg.StalledWS
	}
	if cfg.StormResume {
		r.StormResume, r.StormMoved = true, cfg.StormMoved
	}
	r.SnapBytes = cfg.SnapshotBytes
	if cfg.Scenario == "churn" {
		r.ChurnRate = cfg.ChurnRate
	}
	if cfg.Scenario == "outage" {
		r.Outage = cfg.Outage.String()
	}
	if cfg.Quick && !strings.Contains(r.Command, "-scenario") {
		r.Command += fmt.Sprintf(" # run: -scenario %s -transport %s", cfg.Scenario, cfg.Transport)
		if cfg.KillMaster {
			r.Command += " -kill-master"
		}
	}
	r.Machine = machine{CPUs: runtime.NumCPU(), Model: cpuModel(), MemGB: memGB(), Go: runtime.Version(), LoadAvgStart: loadAvg()}
	b0, t0 := machineCPU()
	time.Sleep(500 * time.Millisecond) // a measurement window, not synchronization
	if b1, t1 := machineCPU(); t1 > t0 {
		r.Machine.BusyBeforePct = 100 * float64(b1-b0) / float64(t1-t0)
	}
	return r
}

func cpuModel() string {
	b, _ := os.ReadFile("/proc/cpuinfo")
	for line := range strings.SplitSeq(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "model name"); ok {
			return strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(v), ":"))
		}
	}
	return ""
}

func memGB() int {
	b, _ := os.ReadFile("/proc/meminfo")
	for line := range strings.SplitSeq(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "MemTotal:"); ok {
			kb, _ := strconv.Atoi(strings.TrimSuffix(strings.TrimSpace(v), " kB"))
			return (kb + 512*1024) / (1024 * 1024)
		}
	}
	return 0
}

func (r *result) fig(name string, v float64, unit string, inTable bool) {
	r.Figures = append(r.Figures, figure{name, v, unit})
	if inTable {
		r.inTable = append(r.inTable, name)
	}
}

func (r *result) latency(name string, h *hdrhistogram.Histogram, inTable bool) {
	ms := func(us int64) float64 { return float64(us) / 1000 }
	r.Latencies[name] = &latencySummary{
		Count: h.TotalCount(), P50: ms(h.ValueAtQuantile(50)), P90: ms(h.ValueAtQuantile(90)),
		P99: ms(h.ValueAtQuantile(99)), P999: ms(h.ValueAtQuantile(99.9)), Max: ms(h.Max()), Mean: h.Mean() / 1000,
	}
	if inTable {
		r.inTable = append(r.inTable, "latency:"+name)
	}
}

func (r *result) warn(format string, args ...any) {
	r.Warnings = append(r.Warnings, fmt.Sprintf(format, args...))
}

func (r *result) note(format string, args ...any) {
	r.Notes = append(r.Notes, fmt.Sprintf(format, args...))
}

func (r *result) fail(format string, args ...any) {
	r.Problems = append(r.Problems, fmt.Sprintf(format, args...))
}

// informational client counts: expected in their scenarios, not errors.
var notErrors = map[string]bool{"stream_end": true, "reconnect_event": true, "ws_close_1012": true}

func (r *result) setConvergence(m *merged) {
	c := &convergence{
		Converged: m.Converged, Live: m.Live, Behind: m.Behind, Ahead: m.Ahead, NotConverged: m.NotConverged,
		Regressions: m.Regressions, RegressionEx: m.RegressionEx, ResumeRepeats: m.ResumeRepeats,
		Reconnects: m.Reconnects, Errors: m.errorCount(),
	}
	r.Convergence = c
	r.ClientCounts = m.Errors
}

// finish fills what every run reports and decides whether it passed.
func (r *result) finish(rn *run) {
	r.ElapsedSec = time.Since(r.started).Seconds()
	r.Machine.LoadAvgEnd = loadAvg()
	if rn.samp != nil {
		r.Samples = rn.samp.all()
	}
	if rn.pub != nil {
		s := rn.pub.stats()
		r.Publisher = &s
		if s.Lost > 0 {
			r.warn("publisher: %d changes were stored nowhere (%s)", s.Lost, s.LastError)
		}
	}
	c := r.Convergence
	switch {
	case c == nil:
		if len(r.Problems) == 0 {
			r.fail("no convergence report")
		}
	default:
		if c.Regressions > 0 {
			r.fail("%d REGRESSIONS: a client saw a version go backwards (%s)", c.Regressions, strings.Join(c.RegressionEx, "; "))
		}
		if c.Live == 0 {
			r.fail("no live connections at the end")
		} else if c.Converged < c.Live {
			r.fail("NOT CONVERGED: %d of %d connections hold their task's last version (%d behind, %d ahead; %s)",
				c.Converged, c.Live, c.Behind, c.Ahead, strings.Join(c.NotConverged, "; "))
		}
	}
	r.OK = len(r.Problems) == 0
}

// report prints the run for a person, failures loudly.
func (r *result) report(w io.Writer) {
	fmt.Fprintf(w, "\n== %s %s %s: %d conns, %d tasks (commit %s, %.0fs)\n", r.Target, r.label(), r.Transport, r.Conns, r.Tasks, r.Commit, r.ElapsedSec)
	for _, f := range r.Figures {
		fmt.Fprintf(w, "   %-28s %s\n", f.Name, fmtValue(f.Value, f.Unit))
	}
	names := make([]string, 0, len(r.Latencies))
	for n := range r.Latencies {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		l := r.Latencies[n]
		fmt.Fprintf(w, "   %-28s n=%d mean %s p50 %s p90 %s p99 %s p99.9 %s max %s\n", n+" latency", l.Count,
			fmtMS(l.Mean), fmtMS(l.P50), fmtMS(l.P90), fmtMS(l.P99), fmtMS(l.P999), fmtMS(l.Max))
	}
	if c := r.Convergence; c != nil {
		fmt.Fprintf(w, "   converged %d/%d, regressions %d, resume repeats %d, reconnects %d, client errors %d\n",
			c.Converged, c.Live, c.Regressions, c.ResumeRepeats, c.Reconnects, c.Errors)
	}
	if len(r.ClientCounts) > 0 {
		fmt.Fprintf(w, "   client counts: %v\n", r.ClientCounts)
	}
	if r.CPU != nil {
		fmt.Fprintf(w, "   cpu over %.1fs: server %.2f, loadgen %.2f, redis %.2f, other %.2f cores; machine %.0f%% busy\n",
			r.CPU.Seconds, r.CPU.Server, r.CPU.LoadGen, r.CPU.Redis, r.CPU.OtherCores, r.CPU.MachineBusy)
		if len(r.CPU.ServerPerNode) > 0 {
			fmt.Fprintf(w, "   server cores per node: %.2f\n", r.CPU.ServerPerNode)
		}
	}
	fmt.Fprintf(w, "   machine: %.0f%% busy before the run; loadavg %s → %s\n", r.Machine.BusyBeforePct, r.Machine.LoadAvgStart, r.Machine.LoadAvgEnd)
	if r.Publisher != nil {
		fmt.Fprintf(w, "   publisher: %s\n", r.Publisher)
	}
	for _, s := range r.Notes {
		fmt.Fprintf(w, "   %s\n", s)
	}
	for _, s := range r.Warnings {
		fmt.Fprintf(w, "   warning: %s\n", s)
	}
	if !r.OK {
		fmt.Fprintf(w, "\n!!!!!!!! FAIL %s %s %s !!!!!!!!\n", r.Target, r.label(), r.Transport)
		for _, p := range r.Problems {
			fmt.Fprintf(w, "!!! %s\n", p)
		}
		fmt.Fprintln(w)
	}
}

const tableHeader = "| scenario | transport | conns | tasks | figures | converged | regressions | commit | command |\n| --- | --- | --- | --- | --- | --- | --- | --- | --- |"

// row is the run as a markdown table row for docs/BENCHMARKS.md.
func (r *result) row() string {
	var figs []string
	for _, name := range r.inTable {
		if n, ok := strings.CutPrefix(name, "latency:"); ok {
			if l := r.Latencies[n]; l != nil {
				figs = append(figs, fmt.Sprintf("%s p50 %s, p99 %s, p99.9 %s, max %s", strings.ReplaceAll(n, "_", " "), fmtMS(l.P50), fmtMS(l.P99), fmtMS(l.P999), fmtMS(l.Max)))
			}
			continue
		}
		for _, f := range r.Figures {
			if f.Name == name {
				figs = append(figs, strings.ReplaceAll(f.Name, "_", " ")+" "+fmtValue(f.Value, f.Unit))
				break
			}
		}
	}
	if !r.OK {
		figs = append(figs, "**FAIL: "+strings.Join(r.Problems, "; ")+"**")
	}
	conv, regs := "-", "-"
	if c := r.Convergence; c != nil {
		conv = fmt.Sprintf("%s/%s", thousands(float64(c.Converged)), thousands(float64(c.Live)))
		regs = strconv.FormatInt(c.Regressions, 10)
	}
	return fmt.Sprintf("| %s | %s | %s | %s | %s | %s | %s | %s | `%s` |", r.label(), r.Transport,
		thousands(float64(r.Conns)), thousands(float64(r.Tasks)), strings.Join(figs, "; "), conv, regs, r.Commit, r.Command)
}

// label is the scenario as the table names it: with -cluster or several
// nodes, the fleet, and the master killed.
func (r *result) label() string {
	switch {
	case r.StormResume:
		return r.Scenario + " (resume, streams)"
	case r.KillMaster:
		return fmt.Sprintf("%s (cluster: %d nodes, %d masters, one killed)", r.Scenario, r.Nodes, clusterMasters)
	case r.Cluster:
		return fmt.Sprintf("%s (cluster: %d nodes, %d masters)", r.Scenario, r.Nodes, clusterMasters)
	case r.KillNode:
		return fmt.Sprintf("%s (%d nodes, one killed)", r.Scenario, r.Nodes)
	case r.Roll:
		return fmt.Sprintf("%s (%d nodes, rolled)", r.Scenario, r.Nodes)
	case r.Nodes > 1:
		return fmt.Sprintf("%s (%d nodes)", r.Scenario, r.Nodes)
	}
	return r.Scenario
}

func fmtMS(ms float64) string {
	switch {
	case ms < 10:
		return fmt.Sprintf("%.2f ms", ms)
	case ms < 100:
		return fmt.Sprintf("%.1f ms", ms)
	}
	return thousands(ms) + " ms"
}

func fmtValue(v float64, unit string) string {
	switch unit {
	case "/s":
		return thousands(v) + "/s"
	case "s":
		return fmt.Sprintf("%.2f s", v)
	case "cores":
		return fmt.Sprintf("%.2f cores", v)
	case "%":
		return fmt.Sprintf("%.0f %%", v)
	case "":
		if v == float64(int64(v)) {
			return thousands(v)
		}
		return fmt.Sprintf("%.2f", v)
	}
	if v != 0 && v < 1 && v > -1 {
		return fmt.Sprintf("%.3f %s", v, unit)
	}
	return fmt.Sprintf("%.1f %s", v, unit)
}

// thousands formats v rounded to an integer with comma separators.
func thousands(v float64) string {
	n := int64(v + 0.5)
	if v < 0 {
		n = int64(v - 0.5)
	}
	s := strconv.FormatInt(n, 10)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	if neg {
		s = "-" + s
	}
	return s
}

// merged is every worker's report added up.
type merged struct {
	workerReport
	scenario string
	phases   map[string]*mergedPhase
}

type mergedPhase struct {
	Deliveries, CatchUp, Connects int64
	WireBytes                     int64
	Latency, Connect              *hdrhistogram.Histogram
	ByTransport                   map[string]*hdrhistogram.Histogram
	ByNode                        []*hdrhistogram.Histogram // nil where no worker recorded one
}

func newMergedPhase() *mergedPhase {
	return &mergedPhase{Latency: newHist(), Connect: newHist(), ByTransport: map[string]*hdrhistogram.Histogram{}}
}

func (m *merged) phase(name string) *mergedPhase {
	if p := m.phases[name]; p != nil {
		return p
	}
	return newMergedPhase()
}

// transportLatency is the phase's latency of one transport's connections.
func (p *mergedPhase) transportLatency(transport string) *hdrhistogram.Histogram {
	if h := p.ByTransport[transport]; h != nil {
		return h
	}
	return newHist()
}

// expectedIn are client counts a scenario causes on purpose: in a storm,
// attempts refused while the node restarts.
var expectedIn = map[string]map[string]bool{
	"storm": {"dial_error": true, "status_503": true, "eof_before_stream": true},
}

func (m *merged) errorCount() int64 {
	var n int64
	for k, v := range m.Errors {
		if !notErrors[k] && !expectedIn[m.scenario][k] {
			n += v
		}
	}
	return n
}

func mergeReports(scenario string, replies []reply) *merged {
	m := &merged{scenario: scenario, phases: map[string]*mergedPhase{}}
	m.Errors = map[string]int64{}
	m.ModeEvents = map[string]*modeSeen{}
	for _, rp := range replies {
		w := rp.Report
		if w == nil {
			continue
		}
		m.Live += w.Live
		m.Converged += w.Converged
		m.Behind += w.Behind
		m.Ahead += w.Ahead
		m.Regressions += w.Regressions
		m.ResumeRepeats += w.ResumeRepeats
		m.Reconnects += w.Reconnects
		m.Opened += w.Opened
		m.ChurnClosed += w.ChurnClosed
		m.Goroutines += w.Goroutines
		if len(m.NotConverged) < 10 {
			m.NotConverged = append(m.NotConverged, w.NotConverged...)
		}
		for _, t := range w.StuckTasks {
			if len(m.StuckTasks) < 10 && !slices.Contains(m.StuckTasks, t) {
				m.StuckTasks = append(m.StuckTasks, t)
			}
		}
		if len(m.RegressionEx) < 10 {
			m.RegressionEx = append(m.RegressionEx, w.RegressionEx...)
		}
		m.Stalled = append(m.Stalled, w.Stalled...)
		for k, v := range w.Errors {
			m.Errors[k] += v
		}
		for k, v := range w.ModeEvents {
			s := m.ModeEvents[k]
			if s == nil {
				cp := *v
				m.ModeEvents[k] = &cp
				continue
			}
			s.Count += v.Count
			s.FirstNs = min(s.FirstNs, v.FirstNs)
			s.LastNs = max(s.LastNs, v.LastNs)
		}
		for name, p := range w.Phases {
			mp := m.phases[name]
			if mp == nil {
				mp = newMergedPhase()
				m.phases[name] = mp
			}
			mp.Deliveries += p.Deliveries
			mp.CatchUp += p.CatchUp
			mp.Connects += p.Connects
			mp.WireBytes += p.WireBytes
			mp.Latency.Merge(decodeHist(p.Latency))
			mp.Connect.Merge(decodeHist(p.Connect))
			for t, enc := range p.LatencyByTransport {
				h := mp.ByTransport[t]
				if h == nil {
					h = newHist()
					mp.ByTransport[t] = h
				}
				h.Merge(decodeHist(enc))
			}
			for i, enc := range p.LatencyByNode {
				for len(mp.ByNode) <= i {
					mp.ByNode = append(mp.ByNode, nil)
				}
				if d := decodeHist(enc); d.TotalCount() > 0 {
					if mp.ByNode[i] == nil {
						mp.ByNode[i] = newCoarseHist()
					}
					mp.ByNode[i].Merge(d)
				}
			}
		}
	}
	return m
}

func gcd(a, b int) int {
	for b != 0 {
		a, b = b, a%b
	}
	return a
}
