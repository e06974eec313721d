package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pushd/pushd/auth"
	"github.com/pushd/pushd/fanout"
	"github.com/pushd/pushd/internal/testenv"
	"github.com/pushd/pushd/keys"
	"github.com/pushd/pushd/snapshot"
	"github.com/pushd/pushd/stream/cursor"
)

// The fleet's tests of record: pushd processes on a private Redis Cluster of
// three masters with a replica each, browsers' SSE streams spread over the
// nodes, and the Task State Service publishing straight into the cluster
// (the fanout publisher) or through a node (POST /v1/publish).

var clusterNames = keys.Names{Cluster: true}

const fleetSecret = "fleet-secret"

// fleet is three pushd nodes on one cluster, and the tenants the tests
// use: two whose channels live on each master, two tasks each.
type fleet struct {
	cluster *testenv.RedisCluster
	cc      *redis.ClusterClient
	pub     *fanout.RedisPublisher
	nodes   []*proc
	byOwner map[string][]string // master address → tenants whose channel slot it serves
	tenants []string

	mu       sync.Mutex
	changed  chan struct{} // closed and replaced when a watcher saw something
	watchers []*watcher
	stop     context.CancelFunc
	wg       sync.WaitGroup
}

// startFleet starts the fleet; extra are more flags for every node. With
// --streams the fanout publisher appends to the streams too, as the Task
// State Service must.
func startFleet(t *testing.T, extra ...string) *fleet {
	t.Helper()
	c := testenv.StartRedisCluster(t, 3)
	cc := c.Client()
	var opts []fanout.PublisherOption
	if slices.Contains(extra, "--streams") {
		opts = append(opts, fanout.WithStream(10000))
	}
	f := &fleet{cluster: c, cc: cc, pub: fanout.NewRedisPublisher(cc, clusterNames, opts...),
		changed: make(chan struct{})}
	f.tenants, f.byOwner = c.Spread(2, func(i int) string { return fmt.Sprintf("tenant%d", i) }, clusterNames.Channel)
	for i := range 3 {
		f.nodes = append(f.nodes, startBinary(t, append([]string{"--redis-cluster", "--redis-url", c.Seeds,
			"--jwt-secret", fleetSecret, "--node-name", fmt.Sprintf("node%d", i)}, extra...)...))
	}
	ctx, cancel := context.WithCancel(context.Background())
	f.stop = cancel
	t.Cleanup(func() {
		cancel()
		f.wg.Wait()
	})
	// Every task exists before anyone watches it.
	f.publishAll(t, 1)
	for _, tenant := range f.tenants {
		for i := range f.nodes {
			f.watch(ctx, t, tenant, i)
		}
	}
	f.converged(t, 1)
	return f
}

func tasksOf(tenant string) []string { return []string{tenant + "-a", tenant + "-b"} }

func (f *fleet) tasks() []string {
	var out []string
	for _, tenant := range f.tenants {
		out = append(out, tasksOf(tenant)...)
	}
	return out
}

// taskSnapshot is version of task; its tenant is the task id's prefix.
func taskSnapshot(task string, version int64) *snapshot.Snapshot {
	tenant, _, _ := strings.Cut(task, "-")
	s, err := snapshot.Parse(fmt.Appendf(nil,
		`{"task_id":%q,"tenant_id":%q,"project_id":"p1","user_id":"u1","status":"RUNNING","progress":%d,"version":%d,"updated_at":1710000000000}`,
		task, tenant, version%100, version))
	if err != nil {
		panic(err) // the test's own document
	}
	return s
}

// publish writes version of task into the cluster, through the fanout
// publisher or, when viaNode >= 0, POST /v1/publish on that node. It
// retries while the cluster fails over or migrates (a write can then fail:
// the Task State Service retries too) until ctx ends.
func (f *fleet) publish(ctx context.Context, task string, version int64, viaNode int) error {
	s := taskSnapshot(task, version)
	err := testenv.Retry(ctx, func() error {
		var err error
		if viaNode >= 0 {
			err = postPublish(ctx, f.nodes[viaNode].URL, s)
		} else {
			_, err = f.pub.Publish(ctx, s)
		}
		if err != nil {
			f.cc.ReloadState(ctx)
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("publish %s v%d: %w", task, version, err)
	}
	return nil
}

func postPublish(ctx context.Context, base string, s *snapshot.Snapshot) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/publish", strings.NewReader(string(s.JSON())))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("POST /v1/publish: %s %s", resp.Status, body)
	}
	return nil
}

// publishAll publishes version of every task, alternating between the
// fanout publisher and the nodes.
func (f *fleet) publishAll(t *testing.T, version int64) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	for i, task := range f.tasks() {
		via := i%(len(f.nodes)+1) - 1 // -1: the publisher; else a node
		if via >= 0 && !f.nodes[via].alive() {
			via = -1
		}
		if err := f.publish(ctx, task, version, via); err != nil {
			t.Fatal(err)
		}
	}
}

// watcher is a browser's SSE stream watching one tenant's tasks: it starts
// on one node and, when its stream ends, reconnects to the next one.
type watcher struct {
	tenant string
	first  int // the node it started on

	mu       sync.Mutex
	seen     map[string]int64 // newest version shown, by task
	regress  []string         // an older version shown after a newer one
	connects int
	nodes    []int // the nodes it was connected to, in order
}

func (f *fleet) watch(ctx context.Context, t *testing.T, tenant string, node int) {
	t.Helper()
	tok := fleetToken(t, tenant)
	w := &watcher{tenant: tenant, first: node, seen: map[string]int64{}}
	path := "/v1/events?task=" + strings.Join(tasksOf(tenant), "&task=")
	f.mu.Lock()
	f.watchers = append(f.watchers, w)
	f.mu.Unlock()
	f.wg.Go(func() {
		for i := node; ; i = (i + 1) % len(f.nodes) {
			if f.nodes[i].alive() {
				f.stream(ctx, w, i, path, tok)
			}
			// As EventSource does, wait a moment before the next attempt.
			select {
			case <-ctx.Done():
				return
			case <-time.After(20 * time.Millisecond):
			}
		}
	})
}

func fleetToken(t *testing.T, tenant string) string {
	t.Helper()
	tok, err := auth.NewSigner([]byte(fleetSecret)).Sign(auth.Principal{TenantID: tenant, UserID: "u1", ExpiresAt: time.Now().Add(time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

func (p *proc) alive() bool {
	select {
	case <-p.exited:
		return false
	default:
		return true
	}
}

// stream reads one SSE connection of w until it ends.
func (f *fleet) stream(ctx context.Context, w *watcher, node int, path, tok string) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, f.nodes[node].URL+path, nil)
	if err != nil {
		return
	}
	req.Header.Set("Authorization", "Bearer "+tok)
	resp, err := client.Do(req)
	if err != nil {
		return
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return
	}
	w.mu.Lock()
	w.connects++
	w.nodes = append(w.nodes, node)
	w.mu.Unlock()
	testenv.ReadSSE(resp.Body, func(ev testenv.SSEEvent) {
		if ev.Event != "task" {
			return
		}
		var doc taskDoc
		if json.Unmarshal([]byte(ev.Data), &doc) != nil {
			return
		}
		w.mu.Lock()
		if old := w.seen[doc.TaskID]; doc.Version < old {
			w.regress = append(w.regress, fmt.Sprintf("%s: v%d after v%d (node%d)", doc.TaskID, doc.Version, old, node))
		} else {
			w.seen[doc.TaskID] = doc.Version
		}
		w.mu.Unlock()
		f.mu.Lock()
		close(f.changed)
		f.changed = make(chan struct{})
		f.mu.Unlock()
	})
}

// lagging describes the watchers that have not yet seen version of every
// task they watch, or "".
func (f *fleet) lagging(version int64) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for _, w := range f.watchers {
		w.mu.Lock()
		for _, task := range tasksOf(w.tenant) {
			if w.seen[task] < version {
				out = append(out, fmt.Sprintf("%s (from node%d, on %v): v%d", task, w.first, w.nodes, w.seen[task]))
			}
		}
		w.mu.Unlock()
	}
	return strings.Join(out, "; ")
}

// converged waits until every watcher has seen version of every task it
// watches, and checks none was ever shown an older version after a newer.
func (f *fleet) converged(t *testing.T, version int64) {
	t.Helper()
	timer := time.NewTimer(waitFor)
	defer timer.Stop()
	for {
		f.mu.Lock()
		changed := f.changed
		f.mu.Unlock()
		lag := f.lagging(version)
		if lag == "" {
			break
		}
		select {
		case <-changed:
		case <-timer.C:
			t.Fatalf("watchers still behind v%d after %v: %s", version, waitFor, lag)
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, w := range f.watchers {
		w.mu.Lock()
		if len(w.regress) > 0 {
			t.Errorf("watcher of %s was shown older versions: %v", w.tenant, w.regress)
		}
		w.mu.Unlock()
	}
}

var crossSlotRE = regexp.MustCompile(`(?i)crossslot`)

// noCrossSlot checks that no node logged a CROSSSLOT error and that no
// running Redis answered one.
func (f *fleet) noCrossSlot(t *testing.T) {
	t.Helper()
	for i, n := range f.nodes {
		if m := crossSlotRE.FindString(n.log.String()); m != "" {
			t.Errorf("node%d logged CROSSSLOT:\n%s", i, n.log)
		}
	}
	if n := f.cluster.ErrorCount("CROSSSLOT"); n != 0 {
		t.Errorf("the cluster answered CROSSSLOT %d times", n)
	}
}

// Three nodes, tenants on every master, watchers of every tenant on every
// node: each version published reaches every watcher, whether it came
// through the fanout publisher or a node's POST /v1/publish.
func TestFleetEveryPublishReachesEveryWatcher(t *testing.T) {
	f := startFleet(t)
	for v := int64(2); v <= 4; v++ {
		f.publishAll(t, v)
		f.converged(t, v)
	}
	f.noCrossSlot(t)
}

// A master dies while changes keep coming: its replica takes over, the
// nodes resubscribe, and every watcher converges on the newest versions,
// those published during the failover included.
func TestFleetMasterFailover(t *testing.T) {
	f := startFleet(t)
	f.cluster.WaitReplicated()
	victim := f.cluster.Masters()[0]
	victim.Stop()
	for v := int64(2); v <= 4; v++ { // the first rounds run during the failover
		f.publishAll(t, v)
	}
	f.converged(t, 4)
	// Every node watched a tenant of the dead master: each lost that
	// shard's connection and subscribed its channels on the promoted
	// replica.
	for _, n := range f.nodes {
		n.log.wait(t, regexp.MustCompile(`sharded pubsub connection lost; resubscribing.* master=`+regexp.QuoteMeta(victim.Addr)), nil)
		n.log.wait(t, regexp.MustCompile(`sharded pubsub restored`), nil)
	}
	f.cluster.WaitOK()
	f.publishAll(t, 5)
	f.converged(t, 5)
	f.noCrossSlot(t)
}

// A tenant's channel slot, and one of its tasks' snapshot slot, migrate by
// hand while that tenant's tasks keep changing: no watcher stays stale.
func TestFleetSlotMigration(t *testing.T) {
	f := startFleet(t)
	tenant := f.tenants[0]
	from := f.cluster.MasterOf(clusterNames.Channel(tenant))
	to := f.cluster.OtherMaster(from)

	ctx, cancel := context.WithCancel(context.Background())
	var version int64 = 1
	var pubErr error
	var wg sync.WaitGroup
	wg.Go(func() {
		for ctx.Err() == nil {
			version++
			for _, task := range tasksOf(tenant) {
				if err := f.publish(ctx, task, version, -1); err != nil && ctx.Err() == nil {
					pubErr = err
					return
				}
			}
		}
	})
	f.cluster.MoveSlot(clusterNames.Channel(tenant), to)
	task := tasksOf(tenant)[0]
	if owner := f.cluster.MasterOf(clusterNames.Snapshot(task)); owner != to {
		f.cluster.MoveSlot(clusterNames.Snapshot(task), to)
	} else {
		f.cluster.MoveSlot(clusterNames.Snapshot(task), from)
	}
	cancel()
	wg.Wait()
	if pubErr != nil {
		t.Fatal(pubErr)
	}
	// The last round may have been cut short: publish the next version of
	// every task, and every watcher must reach it.
	f.publishAll(t, version+1)
	f.converged(t, version+1)
	// Each node heard the old master drop the channel and moved it.
	for _, n := range f.nodes {
		n.log.wait(t, regexp.MustCompile(`tenant's slot left its master; resubscribing.* tenant=`+tenant+` master=`+regexp.QuoteMeta(from)), nil)
	}
	f.noCrossSlot(t)
}

// One node is killed: its watchers reconnect to the others and converge,
// and what was published meanwhile reaches everyone.
func TestFleetNodeKilled(t *testing.T) {
	f := startFleet(t)
	dead := f.nodes[0]
	if err := dead.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	<-dead.exited
	f.publishAll(t, 2)
	f.converged(t, 2)
	f.mu.Lock()
	for _, w := range f.watchers {
		w.mu.Lock()
		if w.first == 0 && (w.connects < 2 || slices.Contains(w.nodes[1:], 0)) {
			t.Errorf("watcher of %s that started on the killed node: connections %v, want a second one to another node", w.tenant, w.nodes)
		}
		w.mu.Unlock()
	}
	f.mu.Unlock()
	f.noCrossSlot(t)
}

// With --streams on the cluster: every watcher converges, and a browser
// that reconnects to another node with its Last-Event-ID is resumed from
// the tenant's stream (replayed, not a full resync) and gets what changed
// while it was away. Tenants live on every master.
func TestFleetStreamsResumeOnAnotherNode(t *testing.T) {
	f := startFleet(t, "--streams")
	f.publishAll(t, 2)
	f.converged(t, 2)
	for i, tenant := range f.tenants {
		from, to := i%len(f.nodes), (i+1)%len(f.nodes)
		query := "/v1/events?task=" + strings.Join(tasksOf(tenant), "&task=")
		had, last := readUntilCursor(t, f.nodes[from].URL+query, fleetToken(t, tenant), "")
		if !cursor.Is(last) {
			t.Fatalf("%s on node%d: no stream cursor (%q)", tenant, from, last)
		}
		moved := tasksOf(tenant)[0]
		ctx, cancel := context.WithTimeout(context.Background(), waitFor)
		err := f.publish(ctx, moved, 3, -1)
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		got, _ := readUntilCursor(t, f.nodes[to].URL+query, fleetToken(t, tenant), last)
		t.Logf("%s: node%d's cursor had %v; resumed on node%d with %v", tenant, from, had, to, got)
		if got[moved] != 3 {
			t.Fatalf("%s resumed on node%d: got %v, want %s v3", tenant, to, got, moved)
		}
		for task, v := range got {
			if v < had[task] {
				t.Fatalf("%s resumed on node%d: %s v%d, older than the v%d it had", tenant, to, task, v, had[task])
			}
		}
	}
	// Every resume was served from a stream; none fell back to a full
	// resync.
	var tasks float64
	for i, n := range f.nodes {
		m := metricsOf(t, n.AdminURL)
		for name, v := range m {
			if strings.HasPrefix(name, "pushd_resume_fallbacks_total") && v != 0 {
				t.Errorf("node%d: %s %v", i, name, v)
			}
		}
		tasks += m["pushd_resume_tasks_total"]
	}
	t.Logf("tasks sent for resumes, all nodes: %v", tasks)
	if tasks < float64(len(f.tenants)) {
		t.Errorf("%v tasks sent for resumes, want at least one per tenant (%d)", tasks, len(f.tenants))
	}
	f.publishAll(t, 4)
	f.converged(t, 4)
	f.noCrossSlot(t)
}

// readUntilCursor opens an SSE stream (resuming from the cursor resume unless empty),
// reads the task events up to the first stream cursor, and returns each
// task's newest version and the cursor.
func readUntilCursor(t *testing.T, url, tok, resume string) (map[string]int64, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+tok)
	if resume != "" {
		req.Header.Set("Last-Event-ID", resume)
	}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %s", url, resp.Status)
	}
	got := map[string]int64{}
	var next string
	testenv.ReadSSE(resp.Body, func(ev testenv.SSEEvent) {
		if next != "" {
			return
		}
		if ev.Event == "task" {
			var doc taskDoc
			if json.Unmarshal([]byte(ev.Data), &doc) == nil {
				got[doc.TaskID] = max(got[doc.TaskID], doc.Version)
			}
		}
		if cursor.Is(ev.ID) {
			next = ev.ID
			cancel() // ends the read
		}
	})
	if next == "" {
		t.Fatalf("GET %s: no stream cursor within %v (tasks %v)", url, waitFor, got)
	}
	return got, next
}

// metricsOf reads a node's /metrics: each sample by name and labels.
func metricsOf(t *testing.T, base string) map[string]float64 {
	t.Helper()
	resp, err := client.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /metrics: %s, %v", resp.Status, err)
	}
	out := map[string]float64{}
	for line := range strings.Lines(string(body)) {
		if strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			continue
		}
		v, err := strconv.ParseFloat(strings.TrimSpace(line[i+1:]), 64)
		if err == nil {
			out[line[:i]] = v
		}
	}
	return out
}
