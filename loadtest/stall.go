package main

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/coder/websocket"
	"github.com/prometheus/procfs"
	"golang.org/x/sys/unix"
)

// stalledRcvBuf is a stalled client's receive buffer, set before connect
// so the window it advertises from the handshake on stays that small.
const stalledRcvBuf = 4 << 10

// maxStalledTasks bounds what one stalled client watches: the SSE
// endpoint's default limit of tasks per request.
const maxStalledTasks = 100

// stalledConn is a client that connects, subscribes, and never reads
// again: what the server writes to it piles up in the server's socket
// buffer until its writes block.
type stalledConn struct {
	ws       bool
	closer   io.Closer    // closes the socket, open until the worker ends
	local    *net.TCPAddr // its address, to find the server's end in /proc/net/tcp
	openedNs int64
	cutNs    atomic.Int64 // when the server's end was seen closed; 0 until then
}

// stalledDialer dials from src with a small receive buffer. The Control
// runs before connect, so the handshake already advertises the small window.
func stalledDialer(src string) *net.Dialer {
	d := &net.Dialer{Timeout: 10 * time.Second, KeepAlive: -1}
	if src != "" {
		d.LocalAddr = &net.TCPAddr{IP: net.ParseIP(src)}
	}
	d.Control = func(network, address string, c syscall.RawConn) error {
		if src != "" {
			if err := bindNoPort(network, address, c); err != nil {
				return err
			}
		}
		var serr error
		if err := c.Control(func(fd uintptr) {
			serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUF, stalledRcvBuf)
		}); err != nil {
			return err
		}
		return serr
	}
	return d
}

// stall opens cmd.Count stalled SSE clients and cmd.CountWS stalled
// WebSocket ones, at cmd.Rate per second, answers "stalled", and watches
// their sockets until the worker ends.
func (w *worker) stall(cmd command) {
	total := cmd.Count + cmd.CountWS
	var wg sync.WaitGroup
	var ok, failed atomic.Int64
	start := time.Now()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for j := 0; j < total; {
		due := min(int(cmd.Rate*time.Since(start).Seconds())+1, total)
		for ; j < due; j++ {
			n, ws := cmd.First+j, j >= cmd.Count
			wg.Go(func() {
				sc, err := w.openStalled(n%w.tenants, cmd.Tasks, ws, n)
				if err != nil {
					failed.Add(1)
					w.countErr("stalled_" + errKind(err, false))
					return
				}
				ok.Add(1)
				w.stalledMu.Lock()
				w.stalled = append(w.stalled, sc)
				w.stalledMu.Unlock()
			})
		}
		if j < total {
			<-tick.C
		}
	}
	wg.Wait()
	w.startStallWatch()
	w.send(reply{Type: "stalled", Opened: int(ok.Load()), Failed: int(failed.Load())})
}

// stalledTasks are the tasks of tenant: every one a stalled client watches.
func stalledTasks(tenant, tasks, tenants int) []string {
	var ids []string
	for i := tenant; i < tasks && len(ids) < maxStalledTasks; i += tenants {
		ids = append(ids, taskID(i))
	}
	return ids
}

// openStalled connects one stalled client of tenant and subscribes it to
// the tenant's tasks. It reads the handshake's answer and nothing after.
func (w *worker) openStalled(tenant, tasks int, ws bool, n int) (*stalledConn, error) {
	src := ""
	if len(w.sources) > 0 {
		src = w.sources[n%len(w.sources)]
	}
	d := stalledDialer(src)
	ids := stalledTasks(tenant, tasks, w.tenants)
	token := w.token(tenant) // task `tenant` is one of the tenant's
	// stall runs on one node.
	addr := strings.TrimPrefix(w.nodeURL(0), "http://")
	sc := &stalledConn{ws: ws}
	if ws {
		var nc net.Conn
		client := &http.Client{Transport: &http.Transport{
			DialContext: func(ctx context.Context, network, a string) (net.Conn, error) {
				c, err := d.DialContext(ctx, network, a)
				nc = c
				return c, err
			},
		}}
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		defer cancel()
		wc, resp, err := websocket.Dial(ctx, "ws://"+addr+"/v1/ws", &websocket.DialOptions{
			HTTPClient: client, HTTPHeader: http.Header{"Authorization": {"Bearer " + token}},
			Subprotocols: []string{"pushd.v1"}, CompressionMode: websocket.CompressionDisabled,
		})
		if err != nil {
			if resp != nil && resp.StatusCode != http.StatusSwitchingProtocols {
				return nil, refused(resp)
			}
			return nil, err
		}
		msg := `{"op":"subscribe","id":1,"tasks":["` + strings.Join(ids, `","`) + `"]}`
		if err := wc.Write(ctx, websocket.MessageText, []byte(msg)); err != nil || nc == nil {
			wc.CloseNow()
			return nil, errors.Join(err, errors.New("no socket"))
		}
		sc.closer = closerFunc(wc.CloseNow)
		sc.local, _ = nc.LocalAddr().(*net.TCPAddr)
	} else {
		nc, err := d.Dial("tcp", addr)
		if err != nil {
			return nil, err
		}
		q := "task=" + strings.Join(ids, "&task=")
		req := "GET /v1/events?" + q + " HTTP/1.1\r\nHost: " + addr + "\r\nAccept: text/event-stream\r\nAuthorization: Bearer " + token + "\r\n\r\n"
		nc.SetDeadline(time.Now().Add(15 * time.Second))
		if _, err := nc.Write([]byte(req)); err != nil {
			nc.Close()
			return nil, err
		}
		// A small reader: past the status line and headers it takes at
		// most a little of the stream, and then nothing more is read.
		resp, err := http.ReadResponse(bufio.NewReaderSize(nc, 1024), nil)
		if err != nil {
			nc.Close()
			return nil, err
		}
		if resp.StatusCode != http.StatusOK {
			nc.Close()
			return nil, refused(resp)
		}
		nc.SetDeadline(time.Time{})
		sc.closer = nc
		sc.local, _ = nc.LocalAddr().(*net.TCPAddr)
	}
	sc.openedNs = time.Now().UnixNano()
	return sc, nil
}

// startStallWatch watches the server's end of every stalled socket in
// /proc/net/tcp every 100 ms, until each one is closed or the worker
// ends. The client itself cannot see the close: its receive window is
// full, so the server's FIN waits behind the data the client never reads.
func (w *worker) startStallWatch() {
	if w.stallStop != nil {
		return
	}
	server, err := net.ResolveTCPAddr("tcp", strings.TrimPrefix(w.nodeURL(0), "http://"))
	if err != nil {
		w.logf("stalled clients: %v", err)
		return
	}
	fs, err := procfs.NewDefaultFS()
	if err != nil {
		w.logf("stalled clients: %v", err)
		return
	}
	stop, done := make(chan struct{}), make(chan struct{})
	w.stallStop, w.stallDone = stop, done
	go func() {
		defer close(done)
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			if w.checkStalled(fs, server) {
				return
			}
		}
	}()
}

// checkStalled marks the stalled clients whose server end is no longer
// ESTABLISHED and reports whether every one is.
func (w *worker) checkStalled(fs procfs.FS, server *net.TCPAddr) bool {
	//lint:ignore SA1019 the netlink socket query procfs points to would be a new dependency; /proc/net/tcp serves a load generator
	rows, err := fs.NetTCP()
	if err != nil {
		w.logf("stalled clients: %v", err)
		return false
	}
	type end struct {
		ip   string
		port uint64
	}
	const established = 1 // TCP_ESTABLISHED in /proc/net/tcp's st column
	open := make(map[end]bool)
	for _, r := range rows {
		if r.LocalPort == uint64(server.Port) && r.LocalAddr.Equal(server.IP) {
			open[end{r.RemAddr.String(), r.RemPort}] = r.St == established
		}
	}
	now := time.Now().UnixNano()
	all := true
	w.stalledMu.Lock()
	defer w.stalledMu.Unlock()
	for _, sc := range w.stalled {
		if sc.cutNs.Load() != 0 {
			continue
		}
		if sc.local != nil && !open[end{sc.local.IP.String(), uint64(sc.local.Port)}] {
			sc.cutNs.Store(now)
			continue
		}
		all = false
	}
	return all
}

func (w *worker) stopStall() {
	if w.stallStop != nil {
		close(w.stallStop)
		<-w.stallDone
		w.stallStop, w.stallDone = nil, nil
	}
	w.stalledMu.Lock()
	for _, sc := range w.stalled {
		sc.closer.Close()
	}
	w.stalled = nil
	w.stalledMu.Unlock()
}

func (w *worker) stalledReports() []stalledReport {
	w.stalledMu.Lock()
	defer w.stalledMu.Unlock()
	out := make([]stalledReport, 0, len(w.stalled))
	for _, sc := range w.stalled {
		out = append(out, stalledReport{WS: sc.ws, OpenedNs: sc.openedNs, CutNs: sc.cutNs.Load()})
	}
	return out
}

// convergence answers, per live connection that holds the version of the
// latest expect, when it first did, in ns after refNs.
func (w *worker) convergence(refNs int64) reply {
	r := reply{Type: "convergence"}
	for _, c := range w.snapshotConns() {
		r.Live++
		if at := c.convergedAt.Load(); at != 0 {
			r.Converged++
			r.Delays = append(r.Delays, at-refNs)
		}
	}
	return r
}

// runStall measures healthy clients alone, then beside stalled ones that
// subscribe to the same tasks and never read: delivery latency by
// transport, and how soon after the last publish every healthy client
// holds its task's last version.
func runStall(ctx context.Context, r *run) error {
	if err := r.connectAll(ctx); err != nil {
		return err
	}
	alone, err := r.stallPhase(ctx, "alone")
	if err != nil {
		return err
	}

	if err := r.phase(ctx, "stalling"); err != nil {
		return err
	}
	n := len(r.workers)
	perSSE, perWS := (r.cfg.StalledSSE+n-1)/n, (r.cfg.StalledWS+n-1)/n
	stallStart := time.Now()
	replies, err := r.all(ctx, func(i int) command {
		return command{Cmd: "stall", First: i * (perSSE + perWS), Tasks: r.cfg.Tasks, Rate: r.cfg.Ramp / float64(n),
			Count:   max(0, min(perSSE, r.cfg.StalledSSE-i*perSSE)),
			CountWS: max(0, min(perWS, r.cfg.StalledWS-i*perWS))}
	}, "stalled", time.Duration(float64(r.cfg.StalledSSE+r.cfg.StalledWS)/r.cfg.Ramp*2*float64(time.Second))+time.Minute)
	if err != nil {
		return err
	}
	opened := 0
	for _, rp := range replies {
		opened += rp.Opened
	}
	r.logf("%d of %d stalled clients connected in %v", opened, r.cfg.StalledSSE+r.cfg.StalledWS, time.Since(stallStart).Round(time.Millisecond))
	if opened < r.cfg.StalledSSE+r.cfg.StalledWS {
		r.res.warn("stall: only %d of %d stalled clients connected", opened, r.cfg.StalledSSE+r.cfg.StalledWS)
	}

	beside, err := r.stallPhase(ctx, "beside")
	if err != nil {
		return err
	}
	if err := r.waitCuts(ctx, time.Unix(0, r.pub.lastStored.Load()).Add(stallCutWait)); err != nil {
		return err
	}
	m, err := r.final(ctx)
	if err != nil {
		return err
	}

	for _, ph := range []struct {
		name string
		conv phaseConvergence
	}{{"alone", alone}, {"beside", beside}} {
		p := m.phase(ph.name)
		for _, t := range transports {
			r.res.latency(ph.name+"_"+t, p.transportLatency(t), true)
		}
		ph.conv.report(r.res, ph.name)
	}
	for _, t := range transports {
		a, b := m.phase("alone").transportLatency(t), m.phase("beside").transportLatency(t)
		if a.TotalCount() == 0 || b.TotalCount() == 0 {
			r.res.warn("stall: no %s deliveries to compare (alone %d, beside %d)", t, a.TotalCount(), b.TotalCount())
			continue
		}
		ratio := float64(b.ValueAtQuantile(99)) / float64(max(a.ValueAtQuantile(99), 1))
		r.res.fig("p99_beside_over_alone_"+t, ratio, "x", true)
		if ratio > 2 {
			r.res.warn("stall: %s p99 beside stalled clients is %.1fx the p99 alone (goal: at most 2x)", t, ratio)
		}
	}
	reportStalled(r.res, m.Stalled, stallStart)
	return nil
}

// phaseConvergence is how soon after a phase's last publish the healthy
// clients held their tasks' last versions.
type phaseConvergence struct {
	live, converged int
	delays          []time.Duration // of the converged ones, sorted
}

// within counts the healthy clients that held their last version within d.
func (c phaseConvergence) within(d time.Duration) int {
	n, _ := slices.BinarySearch(c.delays, d+1)
	return n
}

func (c phaseConvergence) report(res *result, phase string) {
	res.fig(phase+"_healthy", float64(c.live), "", false)
	if len(c.delays) > 0 && c.converged == c.live {
		res.fig(phase+"_converge_s", max(0, c.delays[len(c.delays)-1].Seconds()), "s", true)
	}
	late2, late15 := c.live-c.within(2*time.Second), c.live-c.within(15*time.Second)
	res.fig(phase+"_not_converged_2s", float64(late2), "", true)
	res.fig(phase+"_not_converged_15s", float64(late15), "", true)
	if late2 > 0 {
		res.fail("%s: %d of %d healthy clients did not hold their task's last version within 2 s of the last publish (%d not within 15 s)",
			phase, late2, c.live, late15)
	}
}

// stallPhase publishes for the run's duration, then waits up to 15 s after
// the last publish for every healthy client to hold its last version.
func (r *run) stallPhase(ctx context.Context, name string) (phaseConvergence, error) {
	if err := r.phase(ctx, name); err != nil {
		return phaseConvergence{}, err
	}
	pr := r.pub.run(ctx, r.cfg.Rate, r.cfg.Duration)
	r.logf("%s: published %d in %.1fs", name, pr.Sent, pr.Seconds)
	last := time.Unix(0, r.pub.lastStored.Load())
	if err := r.expect(r.pub.lastVersions()); err != nil {
		return phaseConvergence{}, err
	}
	if _, _, _, err := r.waitConverged(ctx, time.Until(last.Add(15*time.Second))); err != nil {
		return phaseConvergence{}, err
	}
	replies, err := r.all(ctx, func(int) command { return command{Cmd: "convergence", RefNs: last.UnixNano()} }, "convergence", 30*time.Second)
	if err != nil {
		return phaseConvergence{}, err
	}
	var c phaseConvergence
	for _, rp := range replies {
		c.live += rp.Live
		c.converged += rp.Converged
		for _, d := range rp.Delays {
			c.delays = append(c.delays, time.Duration(d))
		}
	}
	slices.Sort(c.delays)
	r.logf("%s: %d of %d healthy clients converged, %d within 2 s", name, c.converged, c.live, c.within(2*time.Second))
	return c, nil
}

// stallCutWait is how long after the last publish the scenario waits for
// the server to cut every stalled client: a node that cuts them on its
// write timeout (10 s by default) does well within it.
const stallCutWait = 30 * time.Second

// waitCuts polls the workers every 250 ms until the server has cut every
// stalled client or deadline passes.
func (r *run) waitCuts(ctx context.Context, deadline time.Time) error {
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	for {
		replies, err := r.all(ctx, func(int) command { return command{Cmd: "cuts"} }, "cuts", 30*time.Second)
		if err != nil {
			return err
		}
		stalled, cut := 0, 0
		for _, rp := range replies {
			for _, s := range rp.Stalled {
				stalled++
				if s.CutNs != 0 {
					cut++
				}
			}
		}
		if cut == stalled || time.Now().After(deadline) {
			r.logf("the server cut %d of %d stalled clients", cut, stalled)
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}
}

// reportStalled says how many stalled clients the server cut, by
// transport, and how long after the stalled clients started connecting.
func reportStalled(res *result, stalled []stalledReport, start time.Time) {
	for _, t := range transports {
		var opened, cut int
		var first, last time.Duration = -1, -1
		for _, s := range stalled {
			if s.WS != (t == "ws") {
				continue
			}
			opened++
			if s.CutNs == 0 {
				continue
			}
			cut++
			at := time.Unix(0, s.CutNs).Sub(start)
			if first < 0 || at < first {
				first = at
			}
			last = max(last, at)
		}
		res.fig("stalled_"+t, float64(opened), "", false)
		res.fig("stalled_"+t+"_cut", float64(cut), "", true)
		if cut > 0 {
			res.fig("stalled_"+t+"_first_cut_s", first.Seconds(), "s", false)
			res.fig("stalled_"+t+"_last_cut_s", last.Seconds(), "s", true)
		}
	}
}
