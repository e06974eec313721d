package main

import (
	"strconv"

	"github.com/HdrHistogram/hdrhistogram-go"
)

// The controller and its workers talk JSON lines: commands on the worker's
// stdin, replies on its stdout.

// command is one controller → worker message; Cmd says which fields matter.
type command struct {
	Cmd string `json:"cmd"` // init, open, phase, expect, churn, wake, since, resumed, moved, hold, quiet, held, stall, convergence, cuts, report, close, quit

	// init: URLs are the nodes, connection i dialing node i mod len(URLs).
	URLs      []string `json:"urls,omitempty"`
	Transport string   `json:"transport,omitempty"`
	Target    string   `json:"target,omitempty"` // pushd or centrifugo: how clients connect and what they read
	Secret    []byte   `json:"secret,omitempty"`
	Sources   []string `json:"sources,omitempty"`
	Tenants   int      `json:"tenants,omitempty"`
	Worker    int      `json:"worker,omitempty"`
	// OwnUsers: each connection is a user of its own, its token granting
	// its task's project (-limits production); else a connection is its
	// task's owner, whose token the user's connections share.
	OwnUsers bool `json:"own_users,omitempty"`
	// Deltas: pushd's clients ask for merge patches.
	Deltas bool `json:"deltas,omitempty"`
	// WSCompression: pushd's WebSocket clients offer permessage-deflate.
	WSCompression bool `json:"ws_compression,omitempty"`

	// open: connections First..First+Count-1, connection i watching task
	// i mod Tasks, at Rate per second, over Transport (empty: the one of
	// init). churn: Rate per second, over Tasks. stall: Count stalled SSE
	// clients and CountWS stalled WebSocket clients, client j of tenant
	// (First+j) mod tenants watching every task of it, at Rate per second.
	First   int     `json:"first,omitempty"`
	Count   int     `json:"count,omitempty"`
	CountWS int     `json:"count_ws,omitempty"`
	Tasks   int     `json:"tasks,omitempty"`
	Rate    float64 `json:"rate,omitempty"`

	// phase: deliveries from now on are recorded under Phase.
	Phase string `json:"phase,omitempty"`

	// expect: the version each task should end at, indexed by task; a
	// connection counts as converged once it holds at least that version.
	Versions []int64 `json:"versions,omitempty"`
	// Seq numbers expect commands; progress replies carry the Seq of the
	// expectation they measure, so a late reply to an older one is ignored.
	Seq int64 `json:"seq,omitempty"`

	// wake: clients waiting to reconnect do so now, each after a random
	// delay up to JitterNs.
	JitterNs int64 `json:"jitter_ns,omitempty"`

	// convergence: how long after RefNs (Unix ns) each connection first
	// held the version of the latest expect. since: from now on each
	// connection notes its first delivery of a snapshot published at or
	// after RefNs; resumed reports them. moved: the connections that
	// received a task event on a physical connection dialed after the
	// since mark, and the longest wait for it after RefNs (-kill-node's
	// kill). hold: from now on each connection counts the task events it
	// receives, and which of them carry a version it holds now; quiet:
	// events received at or after RefNs are counted as the quiet window's,
	// every one of them a resend; held reports the counts.
	RefNs int64 `json:"ref_ns,omitempty"`
}

// reply is one worker → controller message.
type reply struct {
	Type string `json:"type"` // ready, opened, stalled, progress, convergence, cuts, resumed, moved, holding, quieted, held, report, churned, closed, log

	// opened
	Opened int `json:"opened,omitempty"`
	Failed int `json:"failed,omitempty"`

	// progress: connections holding at least their expected version, of
	// Live, and when the last of them got there (Unix ns).
	Converged     int   `json:"converged,omitempty"`
	Live          int   `json:"live,omitempty"`
	ConvergedAtNs int64 `json:"converged_at_ns,omitempty"`
	Seq           int64 `json:"seq,omitempty"`

	// convergence: per converged connection, its first holding the
	// expected version, in ns after RefNs (negative: it held it already).
	Delays []int64 `json:"delays,omitempty"`
	// cuts: the worker's stalled clients.
	Stalled []stalledReport `json:"stalled,omitempty"`

	// resumed: by task, what its connections saw since the since mark.
	Resumed map[int]*taskResume `json:"resumed,omitempty"`
	// moved: the connections back on a new physical connection.
	Moved *movedReport `json:"moved,omitempty"`
	// held: what the connections received since the hold mark.
	Held *holdReport `json:"held,omitempty"`

	Report *workerReport `json:"report,omitempty"`
	Msg    string        `json:"msg,omitempty"`
}

// taskResume is one task's connections after a since mark: how many
// received a snapshot published after it, and the longest any of them
// waited for its first.
type taskResume struct {
	Conns   int   `json:"conns"`
	Resumed int   `json:"resumed"`
	MaxNs   int64 `json:"max_ns"`
}

// holdReport is what a worker's connections received after the hold
// mark: task events, and of them the resends, events carrying a version
// the connection held at the mark or received in the quiet window.
type holdReport struct {
	Conns        int   `json:"conns"`          // connections counting since the mark
	Reopened     int   `json:"reopened"`       // of them, those that connected again after it
	LastReopenNs int64 `json:"last_reopen_ns"` // when the last of them did (Unix ns)
	Events       int64 `json:"events"`
	Resent       int64 `json:"resent"`
	Quiet        int64 `json:"quiet"`        // events received in the quiet window
	ResentConns  int   `json:"resent_conns"` // connections sent at least one resend
}

func (h *holdReport) add(o *holdReport) {
	h.Conns += o.Conns
	h.Reopened += o.Reopened
	h.LastReopenNs = max(h.LastReopenNs, o.LastReopenNs)
	h.Events += o.Events
	h.Resent += o.Resent
	h.Quiet += o.Quiet
	h.ResentConns += o.ResentConns
}

// workerReport is what one worker saw, merged by the controller.
type workerReport struct {
	Live          int                     `json:"live"`      // connections alive (not closed by churn)
	Converged     int                     `json:"converged"` // live connections holding exactly the expected version
	Behind        int                     `json:"behind"`    // holding an older version (or none)
	Ahead         int                     `json:"ahead"`     // holding a newer version than the controller published (a bug in the loadtest)
	NotConverged  []string                `json:"not_converged,omitempty"`
	StuckTasks    []int                   `json:"stuck_tasks,omitempty"` // tasks of connections that did not converge, at most 10
	Regressions   int64                   `json:"regressions"`           // a version <= one already seen on the same connection, or < one seen before a reconnect
	RegressionEx  []string                `json:"regression_examples,omitempty"`
	ResumeRepeats int64                   `json:"resume_repeats"` // the version already held, sent again after a reconnect (allowed)
	Reconnects    int64                   `json:"reconnects"`
	Opened        int64                   `json:"opened"` // physical connections established
	ChurnClosed   int64                   `json:"churn_closed"`
	Errors        map[string]int64        `json:"errors,omitempty"`
	Phases        map[string]*phaseReport `json:"phases"`
	ModeEvents    map[string]*modeSeen    `json:"mode_events,omitempty"`
	Goroutines    int                     `json:"goroutines"`
	Stalled       []stalledReport         `json:"stalled,omitempty"`
}

// stalledReport is one stalled client: when its handshake ended and when
// the server's end of its socket was seen closed (0: not seen).
type stalledReport struct {
	WS       bool  `json:"ws,omitempty"`
	OpenedNs int64 `json:"opened_ns"`
	CutNs    int64 `json:"cut_ns,omitempty"`
}

// phaseReport is the deliveries received while a phase was current.
type phaseReport struct {
	Deliveries int64  `json:"deliveries"`
	CatchUp    int64  `json:"catch_up"` // snapshots published before the connection existed: no latency
	Latency    string `json:"latency"`  // encoded HdrHistogram, µs
	Connects   int64  `json:"connects"`
	Connect    string `json:"connect"`    // encoded HdrHistogram of dial → first snapshot, µs
	WireBytes  int64  `json:"wire_bytes"` // read from the servers' sockets
	// LatencyByTransport is Latency split by the connection's transport
	// (sse, ws): runs that mix them report each.
	LatencyByTransport map[string]string `json:"latency_by_transport,omitempty"`
	// LatencyByNode is Latency split by the node (index in -nodes order)
	// the connection was on, at two significant digits.
	LatencyByNode []string `json:"latency_by_node,omitempty"`
}

// modeSeen is when clients received a mode event.
type modeSeen struct {
	Count   int64 `json:"count"`
	FirstNs int64 `json:"first_ns"`
	LastNs  int64 `json:"last_ns"`
}

// The histograms: 1 µs to 60 s, 3 significant digits.
const (
	histMin = 1
	histMax = 60_000_000
	histSig = 3
)

func newHist() *hdrhistogram.Histogram { return hdrhistogram.New(histMin, histMax, histSig) }

// newCoarseHist is newHist at two significant digits: a tenth of the size.
func newCoarseHist() *hdrhistogram.Histogram { return hdrhistogram.New(histMin, histMax, 2) }

func encodeHist(h *hdrhistogram.Histogram) string {
	b, err := h.Encode(hdrhistogram.V2CompressedEncodingCookieBase)
	if err != nil {
		return ""
	}
	return string(b)
}

func decodeHist(s string) *hdrhistogram.Histogram {
	if s == "" {
		return newHist()
	}
	h, err := hdrhistogram.Decode([]byte(s))
	if err != nil {
		return newHist()
	}
	return h
}

// recordUS records d nanoseconds in µs, clamped to the histogram's range.
func recordUS(h *hdrhistogram.Histogram, ns int64) {
	us := ns / 1000
	if us < histMin {
		us = histMin
	}
	if us > histMax {
		us = histMax
	}
	h.RecordValue(us)
}

// Task i's ids. Users and projects belong to one tenant each: i mod
// (tenants*k) mod tenants is i mod tenants.
func taskID(i int) string { return "lt_" + strconv.Itoa(i) }

func tenantOf(i, tenants int) string { return "t" + strconv.Itoa(i%tenants) }

func userIndex(i, tenants int) int { return i % (tenants * 20) }

func userOf(i, tenants int) string { return "u" + strconv.Itoa(userIndex(i, tenants)) }

// connUser is connection id's user when each connection is a user of its
// own: a name no task owner has.
func connUser(id int) string { return "c" + strconv.Itoa(id) }

func projectOf(i, tenants int) string { return "p" + strconv.Itoa(i%(tenants*5)) }
