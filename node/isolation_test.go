package node_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/pushd/pushd/fanout"
	"github.com/pushd/pushd/hub"
	"github.com/pushd/pushd/internal/testenv"
	"github.com/pushd/pushd/snapshot"
)

// TestRandomizedTenantIsolation runs thousands of random operations against
// three nodes: tenants whose projects and users share names, clients over
// SSE and WebSocket subscribing to their own and to other tenants' tasks,
// publishes on the right channels and forged hints on the wrong ones, and
// reconnects that present another client's resume cursor (possibly another
// tenant's). Each client's token grants it no project, p1, or every
// project. Every task message any client receives is checked: it must be
// of the client's tenant, and its user's own or of a granted project.
// PUSHD_ISOLATION_SEED replays a run.
func TestRandomizedTenantIsolation(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("PUSHD_ISOLATION_SEED"); s != "" {
		seed, _ = strconv.ParseUint(s, 10, 64)
	}
	t.Logf("seed %d (PUSHD_ISOLATION_SEED=%d replays it)", seed, seed)
	rng := rand.New(rand.NewPCG(seed, 0))

	const (
		nTenants       = 5
		tasksPerTenant = 6
		nClients       = 30
		ops            = 3000
	)
	c := newCluster(t)
	nodes := []*server{startNode(t, c.config()), startNode(t, c.config()), startNode(t, c.config())}
	pub := fanout.NewRedisPublisher(c.redis.Client, c.redis.Names)
	ctx := context.Background()

	type task struct {
		id, tenant, project, user string
		version                   int64
	}
	var tasks []*task
	tenants := make([]string, nTenants)
	for i := range tenants {
		tenants[i] = testenv.UniqueID("tenant")
		for j := range tasksPerTenant {
			// Every tenant has projects p1, p2 and users u1, u2: the same
			// names must never join tenants.
			tk := &task{id: testenv.UniqueID("task"), tenant: tenants[i], project: fmt.Sprintf("p%d", 1+j%2), user: fmt.Sprintf("u%d", 1+j/3%2), version: 1}
			c.pg.InsertTask(t, testenv.Task{ID: tk.id, TenantID: tk.tenant, ProjectID: tk.project, UserID: tk.user, Status: "RUNNING", Version: 1})
			tasks = append(tasks, tk)
		}
	}
	publish := func(tk *task) {
		tk.version++
		d := fmt.Sprintf(`{"task_id":%q,"tenant_id":%q,"project_id":%q,"user_id":%q,"status":"RUNNING","progress":%d,"version":%d,"updated_at":%d}`,
			tk.id, tk.tenant, tk.project, tk.user, tk.version%101, tk.version, time.Now().UnixMilli())
		if _, err := pub.Publish(ctx, parseDoc(t, d)); err != nil {
			t.Fatal(err)
		}
	}
	for _, tk := range tasks {
		publish(tk)
	}

	var checked atomic.Int64
	clients := make([]*isoClient, nClients)
	open := func(i int, cursorFrom *isoClient) {
		old := clients[i]
		var cl *isoClient
		if old != nil {
			old.close()
			cl = &isoClient{tenant: old.tenant, user: old.user, grant: old.grant, ws: old.ws, tasks: old.tasks, projects: old.projects, scope: old.scope}
		} else {
			cl = &isoClient{tenant: tenants[rng.IntN(nTenants)], user: fmt.Sprintf("u%d", 1+rng.IntN(2)), ws: rng.IntN(2) == 0}
			cl.grant = [][]string{nil, {"p1"}, {"*"}}[rng.IntN(3)]
			for range 1 + rng.IntN(4) {
				cl.tasks = append(cl.tasks, tasks[rng.IntN(len(tasks))].id) // any tenant's
			}
			if rng.IntN(2) == 0 {
				cl.projects = []string{fmt.Sprintf("p%d", 1+rng.IntN(2))}
			}
			cl.scope = rng.IntN(3) == 0
		}
		cl.t, cl.checked = t, &checked
		cl.start(nodes[rng.IntN(len(nodes))].URL, grantedToken(t, cl.tenant, cl.user, cl.grant), cursorFrom)
		clients[i] = cl
	}
	for i := range clients {
		open(i, nil)
	}

	var forged, published, swapped, resubscribed int
	for range ops {
		switch r := rng.IntN(100); {
		case r < 45:
			publish(tasks[rng.IntN(len(tasks))])
			published++
		case r < 65:
			// A hint on one tenant's channel naming another tenant's task,
			// project and user, claiming a newer version.
			tk := tasks[rng.IntN(len(tasks))]
			channel := tenants[rng.IntN(nTenants)]
			payload := fmt.Sprintf(`{"task_id":%q,"version":%d,"project_id":"p%d","user_id":"u%d","tenant_id":%q}`,
				tk.id, tk.version+int64(rng.IntN(3)), 1+rng.IntN(2), 1+rng.IntN(2), channel)
			if rng.IntN(10) == 0 {
				payload = `{"task_id":"` + strings.Repeat("x", rng.IntN(300)) + `","version":"bad"}`
			}
			if err := c.redis.Client.Publish(ctx, c.redis.Names.Channel(channel), payload).Err(); err != nil {
				t.Fatal(err)
			}
			forged++
		case r < 85:
			// Reconnect presenting another client's cursor or versions.
			open(rng.IntN(nClients), clients[rng.IntN(nClients)])
			swapped++
		default:
			cl := clients[rng.IntN(nClients)]
			if !cl.ws {
				open(rng.IntN(nClients), nil)
				continue
			}
			ids := []string{tasks[rng.IntN(len(tasks))].id, tasks[rng.IntN(len(tasks))].id}
			op := "subscribe"
			if rng.IntN(3) == 0 {
				op = "unsubscribe"
			}
			cl.send(map[string]any{"op": op, "id": rng.IntN(1000), "tasks": ids, "projects": []string{fmt.Sprintf("p%d", 1+rng.IntN(2))}})
			resubscribed++
		}
	}
	// A last version of every task, so every live watcher gets something.
	for _, tk := range tasks {
		publish(tk)
	}
	// Wait for every client that watches one of its own tenant's tasks to
	// have received at least one task message, then stop them all.
	for _, cl := range clients {
		own := tasksOf(tasks, func(tk *task) bool { return tk.tenant == cl.tenant }, func(tk *task) (string, string, string) { return tk.id, tk.project, tk.user })
		testenv.Eventually(t, fmt.Sprintf("a task for the client of %s granted %v watching %v / %v / user %v", cl.tenant, cl.grant, cl.tasks, cl.projects, cl.scope), func() bool {
			return cl.got.Load() > 0 || !cl.expectsSome(own)
		})
	}
	for _, cl := range clients {
		cl.close()
	}
	var dropped, hidden int64
	for _, n := range nodes {
		dropped += n.Hub().Stats().Dropped[hub.DropTenant]
		hidden += n.Hub().Stats().Dropped[hub.DropGrant]
	}
	t.Logf("%d operations: %d publishes, %d forged or garbage hints, %d reconnects with another client's cursor, %d WebSocket (un)subscribes; "+
		"%d task messages checked, every one of the client's tenant and grant; %d snapshots of another tenant and %d outside a grant dropped by the nodes",
		ops, published, forged, swapped, resubscribed, checked.Load(), dropped, hidden)
	if checked.Load() < 1000 {
		t.Fatalf("only %d task messages checked: the test did not exercise delivery", checked.Load())
	}
}

// tasksOf lists (task, project, user) of the tasks keep selects.
func tasksOf[T any](all []T, keep func(T) bool, f func(T) (string, string, string)) [][3]string {
	var out [][3]string
	for _, x := range all {
		if keep(x) {
			a, b, c := f(x)
			out = append(out, [3]string{a, b, c})
		}
	}
	return out
}

// isoClient is one browser of the isolation test.
type isoClient struct {
	t        *testing.T
	checked  *atomic.Int64
	tenant   string
	user     string
	grant    []string // the token's projects claim
	ws       bool
	tasks    []string
	projects []string
	scope    bool

	got    atomic.Int64
	mu     sync.Mutex
	lastID string           // the last SSE id: line
	seen   map[string]int64 // task -> newest version received
	wc     *websocket.Conn
	cancel context.CancelFunc
	done   chan struct{}
}

// expectsSome reports whether c subscribed, from the start, to one of its
// own tenant's tasks (given as id, project, user), which the last round of
// publishes reaches.
func (c *isoClient) expectsSome(own [][3]string) bool {
	for _, tk := range own {
		if !c.sees(tk[1], tk[2]) {
			continue
		}
		for _, id := range c.tasks {
			if id == tk[0] {
				return true
			}
		}
		for _, p := range c.projects {
			if p == tk[1] {
				return true
			}
		}
		if c.scope && c.user == tk[2] {
			return true
		}
	}
	return false
}

// sees reports whether the client's token sees a task of project and user.
func (c *isoClient) sees(project, user string) bool {
	return user == c.user || slices.Contains(c.grant, "*") || slices.Contains(c.grant, project)
}

func (c *isoClient) check(data []byte) {
	s, err := snapshot.Parse(data)
	if err != nil {
		c.t.Errorf("client of %s got an unparseable task: %v", c.tenant, err)
		return
	}
	if s.TenantID != c.tenant {
		c.t.Errorf("ISOLATION BROKEN: client of %s received task %s of tenant %s", c.tenant, s.TaskID, s.TenantID)
	}
	if !c.sees(s.ProjectID, s.UserID) {
		c.t.Errorf("GRANT BROKEN: client of user %s granted %v received task %s of project %s, user %s", c.user, c.grant, s.TaskID, s.ProjectID, s.UserID)
	}
	c.checked.Add(1)
	c.got.Add(1)
	c.mu.Lock()
	if c.seen == nil {
		c.seen = make(map[string]int64)
	}
	c.seen[s.TaskID] = max(c.seen[s.TaskID], s.Version)
	c.mu.Unlock()
}

func (c *isoClient) start(base, tok string, cursorFrom *isoClient) {
	var lastID string
	var since map[string]int64
	tasks := c.tasks
	if cursorFrom != nil {
		cursorFrom.mu.Lock()
		lastID = cursorFrom.lastID
		since = make(map[string]int64, len(cursorFrom.seen))
		for id, v := range cursorFrom.seen {
			since[id] = v
			if len(tasks) < 50 {
				tasks = append(tasks[:len(tasks):len(tasks)], id) // its tasks too: they must answer not_found
			}
		}
		cursorFrom.mu.Unlock()
	}
	ctx, cancel := context.WithCancel(context.Background())
	c.cancel, c.done = cancel, make(chan struct{})
	if c.ws {
		wc, _, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(base, "http")+"/v1/ws?access_token="+url.QueryEscape(tok),
			&websocket.DialOptions{Subprotocols: []string{"pushd.v1"}})
		if err != nil {
			c.t.Fatal(err)
		}
		c.wc = wc
		req := map[string]any{"op": "subscribe", "id": 1, "tasks": tasks, "projects": c.projects, "since": since}
		if c.scope {
			req["scope"] = "user"
		}
		c.send(req)
		go func() {
			defer close(c.done)
			for {
				_, b, err := wc.Read(ctx)
				if err != nil {
					return
				}
				var m struct {
					Type string          `json:"type"`
					Task json.RawMessage `json:"task"`
				}
				if err := json.Unmarshal(b, &m); err != nil {
					c.t.Errorf("invalid JSON from the server: %q", b)
					return
				}
				if m.Type == "task" {
					c.check(m.Task)
				}
			}
		}()
		return
	}
	q := url.Values{"access_token": {tok}}
	for _, id := range tasks {
		q.Add("task", id)
	}
	for _, p := range c.projects {
		q.Add("project", p)
	}
	if c.scope {
		q.Set("scope", "user")
	}
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, base+"/v1/events?"+q.Encode(), nil)
	if lastID != "" {
		req.Header.Set("Last-Event-ID", lastID)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		c.t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		c.t.Fatalf("SSE: status %d", resp.StatusCode)
	}
	go func() {
		defer close(c.done)
		defer resp.Body.Close()
		testenv.ReadSSE(resp.Body, func(ev testenv.SSEEvent) {
			if ev.Event != "task" {
				return
			}
			c.check([]byte(ev.Data))
			c.mu.Lock()
			c.lastID = ev.ID
			c.mu.Unlock()
		})
	}()
}

func (c *isoClient) send(v any) {
	b, _ := json.Marshal(v)
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	c.wc.Write(ctx, websocket.MessageText, b) // a failed write shows as a closed connection
}

func (c *isoClient) close() {
	if c.wc != nil {
		c.wc.CloseNow()
	}
	c.cancel()
	<-c.done
}
