package main

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// clockTicks is USER_HZ, the unit of /proc/<pid>/stat times; 100 on every
// Linux this runs on.
const clockTicks = 100

// procRSS is a process's resident set in KB, from /proc/<pid>/status.
func procRSS(pid int) int64 {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			n, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return n
		}
	}
	return 0
}

// procCPU is a process's user plus system time in clock ticks.
func procCPU(pid int) int64 {
	u, s := procTimes(pid)
	return u + s
}

// procTimes is a process's user and system (kernel) time in clock ticks.
func procTimes(pid int) (user, system int64) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, 0
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, 0
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 13 {
		return 0, 0
	}
	user, _ = strconv.ParseInt(f[11], 10, 64)
	system, _ = strconv.ParseInt(f[12], 10, 64)
	return user, system
}

// machineCPU is the whole machine's busy and total ticks, from /proc/stat.
func machineCPU() (busy, total int64) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, 0
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	for i, v := range f[1:] {
		n, _ := strconv.ParseInt(v, 10, 64)
		if i >= 8 { // guest times are already in user and nice
			break
		}
		total += n
		if i != 3 && i != 4 { // idle, iowait
			busy += n
		}
	}
	return busy, total
}

func loadAvg() string {
	b, _ := os.ReadFile("/proc/loadavg")
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return ""
	}
	return strings.Join(f[:3], " ")
}

// metrics is one scrape of /metrics: series (name with labels, as written)
// to value.
type metrics map[string]float64

// metricsClient reads /metrics uncompressed: the sampler reads it twice a
// second through the run, and gzipping it each time cost pushd about 1.5 %
// of its CPU in the light rows, spent on the harness and not on clients.
var metricsClient = &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{DisableCompression: true}}

func scrape(ctx context.Context, base string) (metrics, error) {
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, base+"/metrics", nil)
	resp, err := metricsClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s/metrics: %s", base, resp.Status)
	}
	return parseMetrics(resp.Body), nil
}

func parseMetrics(r io.Reader) metrics {
	m := metrics{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			continue
		}
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			continue
		}
		m[line[:i]] = v
	}
	return m
}

// promLatency summarises what the Prometheus histogram name (seconds)
// counted between scrapes m0 and m1: its mean exactly, its quantiles
// interpolated linearly within their bucket, its max unknown (0). ok is
// false when it counted nothing.
func promLatency(m0, m1 metrics, name string) (l latencySummary, ok bool) {
	type bucket struct{ le, n float64 }
	var bs []bucket
	prefix := name + `_bucket{le="`
	for series, v := range m1 {
		le, found := strings.CutPrefix(series, prefix)
		if !found || le == `+Inf"}` {
			continue
		}
		bound, err := strconv.ParseFloat(strings.TrimSuffix(le, `"}`), 64)
		if err != nil {
			continue
		}
		bs = append(bs, bucket{bound, v - m0[series]})
	}
	count := m1[name+"_count"] - m0[name+"_count"]
	if count <= 0 || len(bs) == 0 {
		return l, false
	}
	slices.SortFunc(bs, func(a, b bucket) int { return cmp.Compare(a.le, b.le) })
	quantile := func(q float64) float64 {
		want, lo, below := q*count, 0.0, 0.0
		for _, b := range bs {
			if b.n >= want {
				return lo + (b.le-lo)*(want-below)/max(b.n-below, 1)
			}
			lo, below = b.le, b.n
		}
		return lo // past the last bound
	}
	ms := func(s float64) float64 { return s * 1000 }
	return latencySummary{
		Count: int64(count), P50: ms(quantile(.5)), P90: ms(quantile(.9)), P99: ms(quantile(.99)), P999: ms(quantile(.999)),
		Mean: ms((m1[name+"_sum"] - m0[name+"_sum"]) / count),
	}, true
}

// sample is the server as seen every 500 ms: with several nodes, their
// sum, and each node's RSS.
type sample struct {
	T           float64 `json:"t"` // seconds since the run started
	RSSKB       int64   `json:"rss_kb"`
	NodeRSSKB   []int64 `json:"node_rss_kb,omitempty"`
	CPUSeconds  float64 `json:"cpu_s"`
	Goroutines  float64 `json:"goroutines"`
	Connections float64 `json:"connections"`
	Deliveries  float64 `json:"deliveries"`
	PGQueries   float64 `json:"pg_queries"`
	Polling     bool    `json:"polling,omitempty"`

	// NodeGoroutines and NodeConnections are each node's, with several.
	NodeGoroutines  []float64 `json:"node_goroutines,omitempty"`
	NodeConnections []float64 `json:"node_connections,omitempty"`
}

// sampler records the server every 500 ms, following it across restarts.
type sampler struct {
	nodes       fleet
	connections string                // the series of live connections
	deliveries  func(metrics) float64 // the server's deliveries so far
	start       time.Time

	mu      sync.Mutex
	samples []sample // guarded by mu
}

func (s *sampler) run(ctx context.Context) {
	tick := time.NewTicker(500 * time.Millisecond)
	defer tick.Stop()
	for {
		s.take(ctx)
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// take samples every node; a sample while any node is down has no figures.
func (s *sampler) take(ctx context.Context) sample {
	sm := sample{T: time.Since(s.start).Seconds()}
	rss := s.nodes.rss()
	if slices.Contains(rss, 0) {
		return sm
	}
	sm.RSSKB = sum(rss)
	if len(rss) > 1 {
		sm.NodeRSSKB = rss
	}
	sm.CPUSeconds = float64(sum(s.nodes.cpu())) / clockTicks
	if each, err := s.nodes.scrapeEach(ctx); err == nil {
		m := sumMetrics(each)
		if len(each) > 1 {
			for _, e := range each {
				sm.NodeGoroutines = append(sm.NodeGoroutines, e["go_goroutines"])
				sm.NodeConnections = append(sm.NodeConnections, e[s.connections])
			}
		}
		sm.Goroutines = m["go_goroutines"]
		sm.Connections = m[s.connections]
		sm.Deliveries = s.deliveries(m)
		sm.PGQueries = m["pushd_postgres_queries_total"]
		sm.Polling = m[`pushd_mode{mode="polling"}`] >= 1
	}
	s.mu.Lock()
	s.samples = append(s.samples, sm)
	s.mu.Unlock()
	return sm
}

func sum(v []int64) int64 {
	var n int64
	for _, x := range v {
		n += x
	}
	return n
}

func (s *sampler) all() []sample {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]sample(nil), s.samples...)
}

// settled takes n samples 500 ms apart and returns the smallest RSS and
// goroutine count: the server at rest, as near to after a GC as can be seen
// from outside.
func (s *sampler) settled(ctx context.Context, n int) (rssKB int64, goroutines float64) {
	st := s.settledEach(ctx, n)
	return st.RSSKB, st.Goroutines
}

// rest is the server at rest: over several samples, the smallest RSS and
// goroutines of the fleet and, with several nodes, of each node (each
// node's own smallest), and each node's connections at its last sample.
type rest struct {
	RSSKB           int64
	Goroutines      float64
	NodeRSSKB       []int64
	NodeGoroutines  []float64
	NodeConnections []float64
}

// settledEach is settled node by node.
func (s *sampler) settledEach(ctx context.Context, n int) rest {
	tick := time.NewTicker(500 * time.Millisecond)
	defer tick.Stop()
	r := rest{RSSKB: -1, Goroutines: -1}
	for i := range n {
		if i > 0 {
			select {
			case <-ctx.Done():
				return r
			case <-tick.C:
			}
		}
		sm := s.take(ctx)
		if r.RSSKB < 0 || (sm.RSSKB > 0 && sm.RSSKB < r.RSSKB) {
			r.RSSKB = sm.RSSKB
		}
		if r.Goroutines < 0 || (sm.Goroutines > 0 && sm.Goroutines < r.Goroutines) {
			r.Goroutines = sm.Goroutines
		}
		r.NodeRSSKB = minEach(r.NodeRSSKB, sm.NodeRSSKB)
		r.NodeGoroutines = minEach(r.NodeGoroutines, sm.NodeGoroutines)
		if sm.NodeConnections != nil {
			r.NodeConnections = sm.NodeConnections
		}
	}
	return r
}

// minEach is the smaller of a and b element by element, where b has a
// value (above 0): a node's missing sample does not count as its least.
func minEach[T int64 | float64](a, b []T) []T {
	if len(b) == 0 {
		return a
	}
	if len(a) != len(b) {
		return slices.Clone(b)
	}
	for i := range a {
		if b[i] > 0 && (a[i] <= 0 || b[i] < a[i]) {
			a[i] = b[i]
		}
	}
	return a
}

// cpuMark is the CPU time of everything the run measures, at one moment.
type cpuMark struct {
	at           time.Time
	nodes        []int64 // each pushd node's
	nodesKernel  int64   // the running nodes' system time, of nodes
	workers      int64
	redis        int64
	self         int64
	machineBusy  int64
	machineTotal int64
}

// cpuUse is CPU time between two marks, in cores.
type cpuUse struct {
	Seconds float64 `json:"seconds"`
	Server  float64 `json:"server_cores"`
	// ServerPerNode is Server node by node, with several nodes.
	ServerPerNode []float64 `json:"server_cores_per_node,omitempty"`
	// ServerUser and ServerKernel split Server into the server's own code
	// and the kernel's work on its behalf (system calls, the TCP stack).
	// A node that ended during the run counts in Server only.
	ServerUser   float64 `json:"server_user_cores"`
	ServerKernel float64 `json:"server_kernel_cores"`
	// Split says how: "perf" (sampled, cpusplit.go) or "proc" (/proc's
	// tick-counted user and system times).
	Split       string  `json:"server_split,omitempty"`
	LoadGen     float64 `json:"loadgen_cores"` // workers and the controller (publisher)
	Workers     float64 `json:"worker_cores"`  // the workers alone: the clients
	Redis       float64 `json:"redis_cores"`
	MachineBusy float64 `json:"machine_busy_pct"`
	// OtherCores is the machine's busy time not spent by the server, the
	// load generator or Redis: PostgreSQL, and other work on the machine.
	OtherCores float64 `json:"other_cores"`
}

func (a cpuMark) to(b cpuMark) cpuUse {
	el := b.at.Sub(a.at).Seconds()
	if el <= 0 {
		return cpuUse{}
	}
	cores := func(t int64) float64 { return float64(t) / clockTicks / el }
	u := cpuUse{Seconds: el, Server: cores(sum(b.nodes) - sum(a.nodes)), LoadGen: cores(b.workers - a.workers + b.self - a.self), Workers: cores(b.workers - a.workers), Redis: cores(max(0, b.redis-a.redis))}
	u.ServerKernel = cores(max(0, b.nodesKernel-a.nodesKernel))
	u.ServerUser = max(0, u.Server-u.ServerKernel)
	if len(b.nodes) > 1 && len(a.nodes) == len(b.nodes) {
		for i := range b.nodes {
			u.ServerPerNode = append(u.ServerPerNode, cores(b.nodes[i]-a.nodes[i]))
		}
	}
	if t := b.machineTotal - a.machineTotal; t > 0 {
		u.MachineBusy = 100 * float64(b.machineBusy-a.machineBusy) / float64(t)
		u.OtherCores = max(0, u.MachineBusy/100*float64(runtime.NumCPU())-u.Server-u.LoadGen-u.Redis)
	}
	return u
}

// tcpExt reads counters of /proc/net/netstat's TcpExt lines: machine-wide,
// so other work on the machine adds to them.
func tcpExt(names ...string) map[string]int64 {
	b, err := os.ReadFile("/proc/net/netstat")
	if err != nil {
		return nil
	}
	lines := strings.Split(string(b), "\n")
	out := map[string]int64{}
	for i := 0; i+1 < len(lines); i++ {
		if !strings.HasPrefix(lines[i], "TcpExt:") || !strings.HasPrefix(lines[i+1], "TcpExt:") {
			continue
		}
		keys, vals := strings.Fields(lines[i])[1:], strings.Fields(lines[i+1])[1:]
		for j, k := range keys {
			for _, n := range names {
				if k == n && j < len(vals) {
					out[k], _ = strconv.ParseInt(vals[j], 10, 64)
				}
			}
		}
		break
	}
	return out
}

// listenCounters are the accept-queue overflows and SYN retransmissions a
// connection storm causes.
var listenCounters = []string{"ListenOverflows", "ListenDrops", "TCPSynRetrans"}

// kernelMem is the machine's kernel memory that sockets take, in KB:
// TCP socket buffers (/proc/net/sockstat's "TCP: ... mem", in pages) and
// the slab caches each socket takes an object of (socketCaches, from
// /proc/slabinfo: active objects times their size). Both are
// machine-wide: whatever else runs on the machine moves them too.
// /proc/slabinfo is root's to read; without it SlabKB is /proc/meminfo's
// Slab, every cache, and WholeSlab says so.
type kernelMem struct {
	SockKB, SlabKB int64
	WholeSlab      bool
}

// socketCaches are the slab caches a TCP socket takes an object of: its
// struct (TCP, TCPv6), its inode, its file and its epoll entry. The
// dentry each one also has is left out: that cache is the file system's
// too, and other work on the machine moves it by more than a small run's
// sockets take.
var socketCaches = []string{"TCP", "TCPv6", "sock_inode_cache", "filp", "eventpoll_epi", "eventpoll_pwq"}

func readKernelMem() kernelMem {
	var k kernelMem
	if b, err := os.ReadFile("/proc/net/sockstat"); err == nil {
		for line := range strings.SplitSeq(string(b), "\n") {
			rest, ok := strings.CutPrefix(line, "TCP:")
			if !ok {
				continue
			}
			f := strings.Fields(rest)
			for i := 0; i+1 < len(f); i += 2 {
				if f[i] == "mem" {
					pages, _ := strconv.ParseInt(f[i+1], 10, 64)
					k.SockKB = pages * int64(os.Getpagesize()) / 1024
				}
			}
		}
	}
	if b, err := os.ReadFile("/proc/slabinfo"); err == nil {
		var bytes int64
		for line := range strings.SplitSeq(string(b), "\n") {
			// name <active_objs> <num_objs> <objsize> ...
			f := strings.Fields(line)
			if len(f) < 4 || !slices.Contains(socketCaches, f[0]) {
				continue
			}
			active, _ := strconv.ParseInt(f[1], 10, 64)
			size, _ := strconv.ParseInt(f[3], 10, 64)
			bytes += active * size
		}
		k.SlabKB = bytes / 1024
		return k
	}
	k.WholeSlab = true
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		for line := range strings.SplitSeq(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, "Slab:"); ok {
				k.SlabKB, _ = strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			}
		}
	}
	return k
}
