package main

import (
	"bufio"
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"runtime"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"

	"github.com/pushd/pushd/auth"
	"github.com/pushd/pushd/snapshot"
)

// workerMain runs a worker: it holds client connections and answers the
// controller's commands until stdin closes or it is told to quit.
func workerMain(in io.Reader, out io.Writer) int {
	raiseNoFile()
	w := &worker{out: json.NewEncoder(out), prof: newProfiler()}
	w.setPhase("ramp")
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	for sc.Scan() {
		var cmd command
		if err := json.Unmarshal(sc.Bytes(), &cmd); err != nil {
			w.logf("bad command: %v", err)
			continue
		}
		if cmd.Cmd == "quit" {
			break
		}
		w.handle(cmd)
		if cmd.Cmd == "init" {
			w.prof.startCPU(w.index)
		}
	}
	w.shutdown()
	w.prof.stop()
	return 0
}

// shutdown ends every connection and waits until nothing the worker
// started runs: no dialer, reader, timer or poller loop is left.
func (w *worker) shutdown() {
	w.stopProgress()
	w.stopChurn()
	w.stopStall()
	w.dialq.close() // a connection opened from now on ends before its first attempt
	w.closeAll()
	if w.poller != nil {
		w.poller.close()
	}
	w.dialq.wait()
}

// worker holds connections. Its fields are set by init before any
// connection exists and read-only afterwards, except where noted.
type worker struct {
	outMu sync.Mutex
	out   *json.Encoder
	prof  *profiler // owned by the command loop

	urls       []string // the nodes, http://host:port: connection i dials urls[i mod len]
	transport  string
	centrifugo bool   // the server is Centrifugo: its endpoints, tokens and protocol
	deltas     bool   // pushd's clients ask for merge patches
	deflate    bool   // pushd's WebSocket clients offer permessage-deflate
	secret     []byte // the token secret
	tenants    int
	ownUsers   bool // each connection a user of its own (init's OwnUsers)
	signer     *auth.Signer
	sources    []string // loopback source addresses, as init named them
	dialers    []*net.Dialer
	index      int
	poller     *poller // reads established streams; nil: each session's goroutine does

	dialq dialQueue // runs the connections' attempts and backoffs

	tokMu  sync.Mutex
	tokens map[int]string // by user index; for Centrifugo by task, whose channel the token subscribes to

	connsMu sync.Mutex
	conns   []*conn      // live connections, in no order
	nextID  atomic.Int64 // ids of connections opened by churn

	phase   atomic.Pointer[phase]
	phaseMu sync.Mutex
	phases  map[string]*phase // every phase so far, guarded by phaseMu

	targets atomic.Pointer[[]int64] // expected version per task

	since atomic.Int64 // Unix ns of the latest since command: connections note their first delivery published after it
	quiet atomic.Int64 // Unix ns of the latest quiet command, 0 before one since the hold mark

	regressions   atomic.Int64
	resumeRepeats atomic.Int64
	reconnects    atomic.Int64
	opened        atomic.Int64
	churnClosed   atomic.Int64

	errMu    sync.Mutex
	errs     map[string]int64
	regExMu  sync.Mutex
	regEx    []string
	modeMu   sync.Mutex
	modeSeen map[string]*modeSeen

	stalledMu sync.Mutex
	stalled   []*stalledConn // guarded by stalledMu

	progressStop chan struct{} // owned by the command loop
	progressDone chan struct{}
	churnStop    chan struct{}
	churnDone    chan struct{}
	stallStop    chan struct{} // owned by the command loop once stall answered
	stallDone    chan struct{}
}

// nodeURL is the node connection id dials: connections go round-robin
// over the nodes.
func (w *worker) nodeURL(id int) string { return w.urls[id%len(w.urls)] }

// isWS says whether connection id is a WebSocket, of a run of transport
// (-transport). A mixed run's WebSockets are on the odd nodes, so that each
// node's memory per connection is of one transport; with one node, they
// are every other connection.
func (w *worker) isWS(id int, transport string) bool {
	switch {
	case transport != "mixed":
		return transport == "ws"
	case len(w.urls) == 1:
		return id%2 == 1
	default:
		return id%len(w.urls)%2 == 1
	}
}

func (w *worker) send(r reply) {
	w.outMu.Lock()
	defer w.outMu.Unlock()
	w.out.Encode(r)
}

func (w *worker) logf(format string, args ...any) {
	w.send(reply{Type: "log", Msg: fmt.Sprintf("worker %d: ", w.index) + fmt.Sprintf(format, args...)})
}

func (w *worker) handle(cmd command) {
	switch cmd.Cmd {
	case "init":
		w.init(cmd)
		w.send(reply{Type: "ready"})
	case "open":
		go w.open(cmd)
	case "phase":
		w.setPhase(cmd.Phase)
		w.send(reply{Type: "phased"})
	case "expect":
		w.expect(cmd.Versions, cmd.Seq)
	case "churn":
		w.stopChurn()
		if cmd.Rate > 0 {
			w.startChurn(cmd)
		}
		w.send(reply{Type: "churning"})
	case "wake":
		w.wakeAll(time.Duration(cmd.JitterNs))
	case "since":
		w.markSince(cmd.RefNs)
	case "resumed":
		w.send(reply{Type: "resumed", Resumed: w.resumed()})
	case "moved":
		w.send(reply{Type: "moved", Moved: w.moved(cmd.RefNs)})
	case "hold":
		w.markHold()
		w.send(reply{Type: "holding"})
	case "quiet":
		w.quiet.Store(cmd.RefNs)
		w.send(reply{Type: "quieted"})
	case "held":
		w.send(reply{Type: "held", Held: w.held()})
	case "stall":
		w.stall(cmd)
	case "convergence":
		w.send(w.convergence(cmd.RefNs))
	case "cuts":
		w.send(reply{Type: "cuts", Stalled: w.stalledReports()})
	case "report":
		w.stopProgress()
		if err := w.prof.writeHeap(w.index); err != nil {
			w.logf("heap profile: %v", err)
		}
		w.send(reply{Type: "report", Report: w.report()})
	case "close":
		w.stopChurn()
		w.stopStall()
		w.closeAll()
		w.send(reply{Type: "closed"})
	default:
		w.logf("unknown command %q", cmd.Cmd)
	}
}

func (w *worker) init(cmd command) {
	w.urls = cmd.URLs
	w.transport = cmd.Transport
	w.centrifugo = cmd.Target == "centrifugo"
	w.deltas = cmd.Deltas && !w.centrifugo
	w.deflate = cmd.WSCompression && !w.centrifugo
	w.secret = cmd.Secret
	w.tenants = max(cmd.Tenants, 1)
	w.ownUsers = cmd.OwnUsers
	w.signer = auth.NewSigner(cmd.Secret)
	w.index = cmd.Worker
	w.sources = cmd.Sources
	w.tokens = map[int]string{}
	w.errs = map[string]int64{}
	w.modeSeen = map[string]*modeSeen{}
	w.nextID.Store(int64(cmd.Worker+1) * 1_000_000_000)
	for _, s := range cmd.Sources {
		d := &net.Dialer{
			LocalAddr: &net.TCPAddr{IP: net.ParseIP(s)},
			Control:   bindNoPort,
			Timeout:   10 * time.Second,
			KeepAlive: -1,
		}
		w.dialers = append(w.dialers, d)
	}
	if len(w.dialers) == 0 {
		w.dialers = []*net.Dialer{{Timeout: 10 * time.Second, KeepAlive: -1}}
	}
	p, err := newPoller()
	if err != nil {
		w.logf("connections read on their own goroutines: %v", err)
	}
	w.poller = p
}

// token returns a token of the user of task i; for Centrifugo, one that
// also subscribes the connection to the task's channel.
func (w *worker) token(task int) string {
	key := userIndex(task, w.tenants)
	if w.centrifugo {
		key = task
	}
	w.tokMu.Lock()
	defer w.tokMu.Unlock()
	if t, ok := w.tokens[key]; ok {
		return t
	}
	var t string
	var err error
	if w.centrifugo {
		t, err = centrifugoToken(w.secret, task, w.tenants)
	} else {
		t, err = w.signer.Sign(auth.Principal{TenantID: tenantOf(task, w.tenants), UserID: userOf(task, w.tenants), ExpiresAt: time.Now().Add(12 * time.Hour)})
	}
	if err != nil {
		w.logf("sign: %v", err)
	}
	w.tokens[key] = t
	return t
}

// connToken is a token of connection id's own user, granting the project
// of its task: as a browser holds, one per client, so per-user caps and
// buckets count one connection each. Minted per connection, not cached.
func (w *worker) connToken(id, task int) string {
	t, err := w.signer.Sign(auth.Principal{TenantID: tenantOf(task, w.tenants), UserID: connUser(id),
		Grant: &snapshot.Grant{Projects: []string{projectOf(task, w.tenants)}}, ExpiresAt: time.Now().Add(12 * time.Hour)})
	if err != nil {
		w.logf("sign: %v", err)
	}
	return t
}

func (w *worker) countErr(kind string) {
	w.errMu.Lock()
	w.errs[kind]++
	w.errMu.Unlock()
}

func (w *worker) regression(c *conn, from, to int64, kind string) {
	w.regressions.Add(1)
	w.regExMu.Lock()
	if len(w.regEx) < 10 {
		w.regEx = append(w.regEx, fmt.Sprintf("%s: conn %d task %s: version %d after %d", kind, c.id, taskID(int(c.task)), to, from))
	}
	w.regExMu.Unlock()
}

func (w *worker) sawMode(mode string, now int64) {
	w.modeMu.Lock()
	m := w.modeSeen[mode]
	if m == nil {
		m = &modeSeen{FirstNs: now}
		w.modeSeen[mode] = m
	}
	m.Count++
	m.LastNs = now
	w.modeMu.Unlock()
}

// open ramps connections First..First+Count-1 at Rate per second and answers
// "opened" once each has made its first attempt.
func (w *worker) open(cmd command) {
	var wg sync.WaitGroup
	var ok, failed atomic.Int64
	start := time.Now()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for i := 0; i < cmd.Count; {
		due := min(int(cmd.Rate*time.Since(start).Seconds())+1, cmd.Count)
		transport := cmp.Or(cmd.Transport, w.transport)
		for ; i < due; i++ {
			id := cmd.First + i
			c := w.newConn(id, id%cmd.Tasks, w.isWS(id, transport))
			wg.Add(1)
			c.start(func(err error) {
				if err != nil {
					failed.Add(1)
				} else {
					ok.Add(1)
				}
				wg.Done()
			})
		}
		if i < cmd.Count {
			<-tick.C
		}
	}
	wg.Wait()
	w.send(reply{Type: "opened", Opened: int(ok.Load()), Failed: int(failed.Load())})
}

func (w *worker) newConn(id, task int, ws bool) *conn {
	tok := w.token(task)
	if w.ownUsers {
		tok = w.connToken(id, task)
	}
	c := &conn{w: w, id: id, task: int32(task), token: tok, ws: ws}
	w.connsMu.Lock()
	c.slot = len(w.conns)
	w.conns = append(w.conns, c)
	w.connsMu.Unlock()
	return c
}

// removeConn takes c out of the live set.
func (w *worker) removeConn(c *conn) {
	w.connsMu.Lock()
	defer w.connsMu.Unlock()
	i := c.slot
	if i < 0 || i >= len(w.conns) || w.conns[i] != c {
		return
	}
	last := w.conns[len(w.conns)-1]
	w.conns[i] = last
	last.slot = i
	w.conns = w.conns[:len(w.conns)-1]
	c.slot = -1
}

func (w *worker) snapshotConns() []*conn {
	w.connsMu.Lock()
	defer w.connsMu.Unlock()
	return append([]*conn(nil), w.conns...)
}

func (w *worker) closeAll() {
	for _, c := range w.snapshotConns() {
		c.close()
	}
}

// startChurn closes a random connection and opens a new one, Rate times a
// second, until stopChurn.
func (w *worker) startChurn(cmd command) {
	stop, done := make(chan struct{}), make(chan struct{})
	w.churnStop, w.churnDone = stop, done
	go func() {
		defer close(done)
		start := time.Now()
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
		n := 0
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			due := int(cmd.Rate * time.Since(start).Seconds())
			for ; n < due; n++ {
				w.connsMu.Lock()
				var victim *conn
				if len(w.conns) > 0 {
					victim = w.conns[rand.IntN(len(w.conns))]
				}
				w.connsMu.Unlock()
				if victim != nil {
					victim.close()
					w.churnClosed.Add(1)
				}
				id := int(w.nextID.Add(1))
				c := w.newConn(id, rand.IntN(cmd.Tasks), w.isWS(id, w.transport))
				c.start(nil)
			}
		}
	}()
}

func (w *worker) stopChurn() {
	if w.churnStop != nil {
		close(w.churnStop)
		<-w.churnDone
		w.churnStop, w.churnDone = nil, nil
	}
}

// wakeAll ends the backoff of every connection waiting to reconnect:
// each reconnects after its wake jitter, drawn anew up to jitter when it
// is above 0.
func (w *worker) wakeAll(jitter time.Duration) {
	conns := w.snapshotConns()
	if jitter > 0 {
		for _, c := range conns {
			c.wakeJitter.Store(int64(rand.N(jitter)))
		}
	}
	for _, c := range conns {
		c.wake()
	}
}

// markSince starts watching, on every connection, for the first delivery
// of a snapshot published at or after ref (Unix ns), and for the first
// task event on a physical connection dialed at or after it.
func (w *worker) markSince(ref int64) {
	for _, c := range w.snapshotConns() {
		c.firstAfter.Store(0)
		c.back.Store(0)
	}
	w.since.Store(ref)
}

// resumed is, per task, how long after the since mark its connections
// first received a snapshot published after it.
func (w *worker) resumed() map[int]*taskResume {
	ref := w.since.Load()
	out := map[int]*taskResume{}
	for _, c := range w.snapshotConns() {
		tr := out[int(c.task)]
		if tr == nil {
			tr = &taskResume{}
			out[int(c.task)] = tr
		}
		tr.Conns++
		if at := c.firstAfter.Load(); at != 0 {
			tr.Resumed++
			tr.MaxNs = max(tr.MaxNs, at-ref)
		}
	}
	return out
}

// markHold starts counting, on every connection, the task events it
// receives from now on against the version it holds now.
func (w *worker) markHold() {
	w.quiet.Store(0)
	for _, c := range w.snapshotConns() {
		c.hold.Store(&holdCount{held: c.last.Load()})
	}
}

// held is what the connections received since the hold mark.
func (w *worker) held() *holdReport {
	r := &holdReport{}
	for _, c := range w.snapshotConns() {
		h := c.hold.Load()
		if h == nil {
			continue
		}
		r.Conns++
		if at := h.reopened.Load(); at != 0 {
			r.Reopened++
			r.LastReopenNs = max(r.LastReopenNs, at)
		}
		r.Events += h.events.Load()
		r.Quiet += h.quiet.Load()
		if n := h.resent.Load(); n > 0 {
			r.Resent += n
			r.ResentConns++
		}
	}
	return r
}

// expect sets the version every task should reach and reports progress
// every 100 ms until the next report.
func (w *worker) expect(versions []int64, seq int64) {
	w.stopProgress()
	w.targets.Store(&versions)
	now := time.Now().UnixNano()
	for _, c := range w.snapshotConns() {
		c.convergedAt.Store(0)
		if t := c.target(); t > 0 && c.last.Load() >= t {
			c.convergedAt.CompareAndSwap(0, now)
		}
	}
	stop, done := make(chan struct{}), make(chan struct{})
	w.progressStop, w.progressDone = stop, done
	go func() {
		defer close(done)
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			p := w.progress()
			p.Seq = seq
			w.send(p)
			select {
			case <-stop:
				return
			case <-tick.C:
			}
		}
	}()
}

func (w *worker) stopProgress() {
	if w.progressStop != nil {
		close(w.progressStop)
		<-w.progressDone
		w.progressStop, w.progressDone = nil, nil
	}
}

func (w *worker) progress() reply {
	r := reply{Type: "progress"}
	for _, c := range w.snapshotConns() {
		r.Live++
		if at := c.convergedAt.Load(); at != 0 {
			r.Converged++
			r.ConvergedAtNs = max(r.ConvergedAtNs, at)
		}
	}
	return r
}

func (w *worker) report() *workerReport {
	r := &workerReport{
		Regressions:   w.regressions.Load(),
		ResumeRepeats: w.resumeRepeats.Load(),
		Reconnects:    w.reconnects.Load(),
		Opened:        w.opened.Load(),
		ChurnClosed:   w.churnClosed.Load(),
		Errors:        map[string]int64{},
		Phases:        map[string]*phaseReport{},
		ModeEvents:    map[string]*modeSeen{},
		Goroutines:    runtime.NumGoroutine(),
		Stalled:       w.stalledReports(),
	}
	for _, c := range w.snapshotConns() {
		r.Live++
		t, last := c.target(), c.last.Load()
		switch {
		case t == 0 || last == t:
			r.Converged++
			continue
		case last < t:
			r.Behind++
		default:
			r.Ahead++
		}
		if len(r.StuckTasks) < 10 && !slices.Contains(r.StuckTasks, int(c.task)) {
			r.StuckTasks = append(r.StuckTasks, int(c.task))
		}
		if len(r.NotConverged) < 10 {
			r.NotConverged = append(r.NotConverged, fmt.Sprintf("conn %d task %s: holds %d, want %d (%s)", c.id, taskID(int(c.task)), last, t, c.state()))
		}
	}
	w.errMu.Lock()
	for k, v := range w.errs {
		r.Errors[k] = v
	}
	w.errMu.Unlock()
	w.regExMu.Lock()
	r.RegressionEx = append(r.RegressionEx, w.regEx...)
	w.regExMu.Unlock()
	w.modeMu.Lock()
	for k, v := range w.modeSeen {
		cp := *v
		r.ModeEvents[k] = &cp
	}
	w.modeMu.Unlock()
	w.phaseMu.Lock()
	names := make([]string, 0, len(w.phases))
	for n := range w.phases {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		p := w.phases[n]
		lat, con := newHist(), newHist()
		byT := [2]*hdrhistogram.Histogram{newHist(), newHist()}
		pr := &phaseReport{LatencyByTransport: map[string]string{}, LatencyByNode: make([]string, len(p.byNode))}
		for i := range p.byNode {
			nh := &p.byNode[i]
			nh.mu.Lock()
			pr.LatencyByNode[i] = encodeHist(nh.h)
			nh.mu.Unlock()
		}
		for i := range p.shards {
			s := &p.shards[i]
			s.mu.Lock()
			lat.Merge(s.latency)
			con.Merge(s.connect)
			for t, h := range s.byTransport {
				byT[t].Merge(h)
			}
			pr.Deliveries += s.deliveries
			pr.CatchUp += s.catchUp
			pr.Connects += s.connects
			s.mu.Unlock()
		}
		pr.Latency, pr.Connect = encodeHist(lat), encodeHist(con)
		pr.WireBytes = p.wire.Load()
		for t, h := range byT {
			if h.TotalCount() > 0 {
				pr.LatencyByTransport[transports[t]] = encodeHist(h)
			}
		}
		r.Phases[n] = pr
	}
	w.phaseMu.Unlock()
	return r
}
