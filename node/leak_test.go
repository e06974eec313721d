package node_test

import (
	"bufio"
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/url"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/coder/websocket"

	"github.com/pushd/pushd/fanout"
	"github.com/pushd/pushd/internal/testenv"
)

// TestConnectDisconnectCyclesLeaveNothingBehind opens and closes 10,000
// connections, SSE and WebSocket mixed, each subscribing to a task, a
// project or its user's tasks while updates are published, and ending in
// one of several ways. Afterwards the node's goroutines and heap must be
// where they were after a warm-up: anything a connection leaves behind
// shows up here multiplied by ten thousand.
func TestConnectDisconnectCyclesLeaveNothingBehind(t *testing.T) {
	const (
		warmup  = 500
		cycles  = 10_000
		workers = 16
		tasks   = 20
		// A leak of 100 bytes per connection is 1 MB here.
		heapMargin = 1 << 20
		// The runtime and the HTTP client may keep a goroutine or two
		// parked between uses; a leak per connection is thousands.
		goroutineMargin = 5
	)
	c := newCluster(t)
	cfg := c.config()
	// The Redis pool dialed in full at start: its growth under this load
	// (a few hundred KB of buffers) would otherwise look like a leak.
	cfg.RedisURL += sep(cfg.RedisURL) + "pool_size=20&min_idle_conns=20"
	srv := startNode(t, cfg)
	pub := fanout.NewRedisPublisher(c.redis.Client, c.redis.Names)
	project, user := testenv.UniqueID("proj"), testenv.UniqueID("user")
	ids := make([]string, tasks)
	versions := make([]atomic.Int64, tasks)
	publish := func(i int, v int64) error {
		_, err := pub.Publish(context.Background(), parseDoc(t, fmt.Sprintf(
			`{"task_id":%q,"tenant_id":"t1","project_id":%q,"user_id":%q,"status":"RUNNING","progress":%d,"version":%d,"updated_at":1710000000000}`,
			ids[i], project, user, v%101, v)))
		return err
	}
	for i := range ids {
		ids[i] = testenv.UniqueID("task")
		versions[i].Store(1)
		// The row makes the task listable for project and user subscriptions.
		c.pg.InsertTask(t, testenv.Task{ID: ids[i], TenantID: "t1", ProjectID: project, UserID: user, Status: "RUNNING", Version: 1})
		if err := publish(i, 1); err != nil {
			t.Fatal(err)
		}
	}
	tok := url.QueryEscape(token(t, "t1", user))
	transport := &http.Transport{DisableKeepAlives: true}
	defer transport.CloseIdleConnections()
	client := &http.Client{Transport: transport}

	// cycle opens one connection, waits for its first snapshot, and ends it
	// the way kind says.
	cycle := func(rng *rand.Rand) error {
		i := rng.IntN(tasks)
		if rng.IntN(4) == 0 {
			if err := publish(i, versions[i].Add(1)); err != nil {
				return err
			}
		}
		var query string
		switch rng.IntN(3) {
		case 0:
			query = "task=" + ids[i]
		case 1:
			query = "project=" + project
		default:
			query = "scope=user"
		}
		ctx, cancel := context.WithTimeout(context.Background(), waitFor)
		defer cancel()
		if rng.IntN(2) == 0 {
			return sseCycle(ctx, client, srv.URL+"/v1/events?access_token="+tok+"&"+query, rng.IntN(3))
		}
		return wsCycle(ctx, client, "ws"+strings.TrimPrefix(srv.URL, "http")+"/v1/ws?access_token="+tok, query, rng.IntN(3))
	}
	run := func(n int, seed uint64) {
		var wg sync.WaitGroup
		var next atomic.Int64
		errs := make(chan error, workers)
		for w := range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				rng := rand.New(rand.NewPCG(seed, uint64(w)))
				for next.Add(1) <= int64(n) {
					if err := cycle(rng); err != nil {
						errs <- err
						return
					}
				}
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
	}
	// settle waits until the node has closed every connection and its
	// goroutines are at most want, then returns them and the live heap.
	settle := func(want int) (goroutines int, heap uint64) {
		testenv.Eventually(t, fmt.Sprintf("every connection closed and at most %d goroutines", want), func() bool {
			runtime.GC()
			goroutines = runtime.NumGoroutine()
			st := srv.Hub().Stats()
			return st.Opened == st.Closed && goroutines <= want
		})
		runtime.GC() // twice: the first sweeps what finalizers held
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		return goroutines, ms.HeapAlloc
	}

	run(warmup, 1)
	transport.CloseIdleConnections()
	g0, h0 := settle(1 << 30)
	start := srv.Hub().Stats().Opened
	run(cycles, 2)
	transport.CloseIdleConnections()
	g1, h1 := settle(g0 + goroutineMargin)
	opened := srv.Hub().Stats().Opened - start
	t.Logf("%d connections opened and closed: goroutines %d -> %d, heap %d KB -> %d KB",
		opened, g0, g1, h0>>10, h1>>10)
	if opened != cycles {
		t.Fatalf("the node saw %d connections, want %d", opened, cycles)
	}
	if h1 > h0+heapMargin {
		t.Fatalf("heap grew by %d KB over %d connections (%.0f bytes each); want at most %d KB",
			(h1-h0)>>10, cycles, float64(h1-h0)/cycles, heapMargin>>10)
	}
}

func sep(u string) string {
	if strings.Contains(u, "?") {
		return "&"
	}
	return "?"
}

// sseCycle reads an SSE stream until its first task event (or only its
// hello, for end 0) and hangs up.
func sseCycle(ctx context.Context, client *http.Client, u string, end int) error {
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("SSE: status %d", resp.StatusCode)
	}
	want := "event: task"
	if end == 0 {
		want = "event: hello"
	}
	r := bufio.NewReader(resp.Body)
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			return fmt.Errorf("SSE: %q before the first %q: %w", line, want, err)
		}
		if strings.TrimSpace(line) == want {
			return nil
		}
	}
}

// wsCycle subscribes and waits for the first task (or only the hello, for
// end 0), then closes abruptly (end 1) or with a close handshake.
func wsCycle(ctx context.Context, client *http.Client, u, query string, end int) error {
	wc, _, err := websocket.Dial(ctx, u, &websocket.DialOptions{HTTPClient: client, Subprotocols: []string{"pushd.v1"}})
	if err != nil {
		return err
	}
	defer wc.CloseNow()
	var sub string
	switch key, id, _ := strings.Cut(query, "="); key {
	case "task":
		sub = fmt.Sprintf(`{"op":"subscribe","id":1,"tasks":[%q]}`, id)
	case "project":
		sub = fmt.Sprintf(`{"op":"subscribe","id":1,"projects":[%q]}`, id)
	default:
		sub = `{"op":"subscribe","id":1,"scope":"user"}`
	}
	want := `"type":"task"`
	if end == 0 {
		want = `"type":"hello"`
	} else if err := wc.Write(ctx, websocket.MessageText, []byte(sub)); err != nil {
		return err
	}
	for {
		_, b, err := wc.Read(ctx)
		if err != nil {
			return fmt.Errorf("WebSocket: before the first %s: %w", want, err)
		}
		if strings.Contains(string(b), want) {
			break
		}
	}
	if end == 2 {
		return wc.Close(websocket.StatusNormalClosure, "")
	}
	return nil
}
