package web_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/pushd/pushd/admission"
	"github.com/pushd/pushd/fanout"
	"github.com/pushd/pushd/internal/testenv"
	"github.com/pushd/pushd/keys"
	"github.com/pushd/pushd/node"
	"github.com/pushd/pushd/snapshot"
	"github.com/pushd/pushd/sse"
)

// publishVersion publishes version v of task, tenant t1's, straight to
// Redis as a Task State Service does.
func publishVersion(t *testing.T, pub *fanout.RedisPublisher, task, user string, v int) {
	t.Helper()
	s, err := snapshot.Parse(fmt.Appendf(nil, `{"task_id":%q,"tenant_id":"t1","project_id":"p1","user_id":%q,"status":"RUNNING","progress":%d,"version":%d,"updated_at":1710000000000}`,
		task, user, v, v))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pub.Publish(context.Background(), s); err != nil {
		t.Fatal(err)
	}
}

// eventsURL is the stream of one task, with the token in the URL as a
// browser's EventSource must carry it.
func eventsURL(base, task, token string) string {
	return base + "/v1/events?task=" + url.QueryEscape(task) + "&access_token=" + url.QueryEscape(token)
}

// holdStream opens a stream of u as curl would and keeps it open until the
// returned function (or the test's end) closes it.
func holdStream(t *testing.T, u string) func() {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		cancel()
		resp.Body.Close()
		t.Fatalf("holding a stream: %d", resp.StatusCode)
	}
	var once sync.Once
	end := func() {
		once.Do(func() {
			cancel()
			resp.Body.Close()
		})
	}
	t.Cleanup(end)
	return end
}

// openEventSource opens the browser's own EventSource (not pushd.js) on the
// page and records, with the page's clock, each open, each error event the
// server sent (a refusal), each failure with the readyState it left, and
// the version of each task event.
func openEventSource(p *page, u string) {
	p.t.Helper()
	eval[bool](p, fmt.Sprintf(`(() => {
		const r = window.__es = { opens: [], refusals: [], failures: [], versions: [], modes: [] };
		const es = new EventSource(%q);
		window.__source = es;
		es.addEventListener('open', () => r.opens.push(performance.now()));
		es.addEventListener('error', (e) => {
			if (typeof e.data === 'string') r.refusals.push({ at: performance.now(), body: JSON.parse(e.data) });
			else r.failures.push({ at: performance.now(), state: es.readyState });
		});
		es.addEventListener('task', (e) => r.versions.push(JSON.parse(e.data).version));
		for (const ev of ['hello', 'mode']) es.addEventListener(ev, (e) => r.modes.push(JSON.parse(e.data).mode));
		return true;
	})()`, u))
}

// esRefusal is a refusal the page's EventSource received, and how long
// after it the EventSource opened its next connection.
type esRefusal struct {
	Error        string  `json:"error"`
	RetryAfter   int64   `json:"retry_after"`
	RetryAfterMS int64   `json:"retry_after_ms"`
	Message      string  `json:"message"`
	ReopenedMS   float64 `json:"reopened_ms"`
}

// firstRefusal is the page's first refusal, once the EventSource opened
// again after it.
func firstRefusal(p *page) esRefusal {
	p.t.Helper()
	p.wait("a connection after the refusal", `window.__es.refusals.length > 0 && window.__es.opens.some((at) => at > window.__es.refusals[0].at)`)
	return eval[esRefusal](p, `(() => {
		const r = window.__es, f = r.refusals[0];
		return { ...f.body, reopened_ms: r.opens.find((at) => at > f.at) - f.at };
	})()`)
}

// A page's own EventSource survives each refusal of its stream that
// passes: the node answers it in a stream, the EventSource waits at least
// the refusal's retry_after_ms (measured from the page) and connects again
// by itself, and the task's next version arrives, once.
func TestBrowserEventSourceSurvivesRefusals(t *testing.T) {
	redis := testenv.SharedRedis(t)
	pub := fanout.NewRedisPublisher(redis.Client, redis.Names)
	config := func(a admission.Config) node.Config {
		// The shared Redis is slow under -race; these tests are not about
		// falling back to local limits, which a slow answer would trigger.
		a.Timeout = 2 * time.Second
		return node.Config{RedisURL: redis.URL, KeyPrefix: redis.Names.Prefix, JWTSecret: testSecret, Admission: a,
			SSE: sse.Config{Retry: time.Second}}
	}
	b := newBrowser(t)

	// survive opens the page's EventSource on base for a new task and user
	// after refuse has made sure the node will refuse it, checks the
	// refusal and the wait, and lets the task move on.
	survive := func(t *testing.T, base, code string, refuse func(u string) (after func())) {
		t.Helper()
		task, user := testenv.UniqueID("task"), testenv.UniqueID("user")
		publishVersion(t, pub, task, user, 1)
		u := eventsURL(base, task, signedToken(t, "t1", user))
		p := b.tab(t)
		pr := p.watch()
		p.do("navigate", chromedp.Navigate(base+"/healthz")) // any page of the origin
		after := refuse(u)
		openEventSource(p, u)
		p.wait("the refusal", `window.__es.refusals.length > 0`)
		if after != nil {
			after()
		}
		r := firstRefusal(p)
		if r.Error != code || r.RetryAfterMS <= 0 || r.RetryAfter*1000 < r.RetryAfterMS || r.Message == "" {
			p.fatalf("refusal %+v, want %s with its wait", r, code)
		}
		// The node's retry: is the wait plus jitter, never less; 50 ms for
		// the page's clock, which reads the error event after the
		// EventSource started its timer.
		if r.ReopenedMS < float64(r.RetryAfterMS)-50 {
			p.fatalf("the EventSource connected again %.0f ms after a refusal of %d ms", r.ReopenedMS, r.RetryAfterMS)
		}
		p.wait("version 1", `window.__es.versions.includes(1)`)
		publishVersion(t, pub, task, user, 2)
		p.wait("version 2", `window.__es.versions.includes(2)`)
		if v := eval[[]int](p, `window.__es.versions`); !slices.Equal(v, []int{1, 2}) {
			p.fatalf("versions %v, want 1 and 2, once each", v)
		}
		if closed := eval[int](p, `window.__es.failures.filter((f) => f.state === EventSource.CLOSED).length + (window.__source.readyState === EventSource.CLOSED)`); closed > 0 {
			p.fatalf("the EventSource closed for good")
		}
		// The page itself may miss a favicon; its stream must have no problem.
		pr.mu.Lock()
		list := slices.Clone(pr.list)
		pr.mu.Unlock()
		if i := slices.IndexFunc(list, func(s string) bool { return strings.Contains(s, "/v1/events") }); i >= 0 {
			p.fatalf("the stream had a problem: %s", list[i])
		}
	}

	t.Run("connect rate limit", func(t *testing.T) {
		n := startNode(t, config(admission.Config{ConnectUserBurst: 1, ConnectUserRate: 0.5}))
		survive(t, n.URL, "rate_limit_exceeded", func(u string) func() {
			holdStream(t, u)() // the user's one connect
			return nil
		})
	})

	t.Run("user cap", func(t *testing.T) {
		n := startNode(t, config(admission.Config{MaxConnsPerUser: 1}))
		survive(t, n.URL, "too_many_connections", func(u string) func() {
			return holdStream(t, u) // closed once the page was refused: its slot frees
		})
	})

	t.Run("tenant cap", func(t *testing.T) {
		n := startNode(t, config(admission.Config{MaxConnsPerTenant: 1}))
		survive(t, n.URL, "too_many_connections", func(string) func() {
			// Another user of the tenant holds its one connection.
			return holdStream(t, eventsURL(n.URL, testenv.UniqueID("task"), signedToken(t, "t1", testenv.UniqueID("user"))))
		})
	})

	t.Run("over capacity", func(t *testing.T) {
		cfg := config(admission.Config{})
		cfg.MaxConns = 1
		n := startNode(t, cfg)
		survive(t, n.URL, "over_capacity", func(string) func() {
			return holdStream(t, eventsURL(n.URL, testenv.UniqueID("task"), signedToken(t, "t1", testenv.UniqueID("user"))))
		})
	})

	t.Run("draining", func(t *testing.T) {
		draining, next := startNode(t, config(admission.Config{})), startNode(t, config(admission.Config{}))
		// The hub alone, as Shutdown starts: the listener still answers.
		if err := draining.Hub().Shutdown(context.Background(), 0); err != nil {
			t.Fatal(err)
		}
		// A balancer that has not noticed yet: the first stream goes to the
		// draining node, every later one to the next.
		toDraining, toNext := proxyTo(t, draining.URL), proxyTo(t, next.URL)
		var mu sync.Mutex
		sent := false
		base := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			mu.Lock()
			first := r.URL.Path == "/v1/events" && !sent
			sent = sent || first
			mu.Unlock()
			if first {
				toDraining.ServeHTTP(w, r)
				return
			}
			toNext.ServeHTTP(w, r)
		}))
		survive(t, base, "draining", func(string) func() { return nil })
	})
}

// A node that no snapshot source answers (Redis stopped, PostgreSQL cut:
// /readyz says not ready) keeps a browser's own EventSource alive both
// ways it can meet it. A session token, which neither store of sessions
// can check, is refused unavailable in a stream: the EventSource waits the
// refusal's wait and connects again by itself. A signed token needs no
// store, so its stream opens and polls. Once the sources are back, both
// get the task's version from PostgreSQL, then its next one from a hint.
func TestBrowserEventSourceSurvivesANodeWithoutSources(t *testing.T) {
	rs := testenv.StartRedis(t)
	pg := testenv.Database(t)
	pgURL, err := url.Parse(pg.URL)
	if err != nil {
		t.Fatal(err)
	}
	proxy := testenv.StartProxy(t, pgURL.Host)
	pgURL.Host = proxy.Addr
	n := startNode(t, node.Config{RedisURL: rs.URL, DatabaseURL: pgURL.String(), JWTSecret: testSecret,
		SSE: sse.Config{Retry: time.Second}})
	ctx := testenv.Context(t)
	task, user := testenv.UniqueID("task"), testenv.UniqueID("user")
	write := func(v int64) {
		pg.InsertTask(t, testenv.Task{ID: task, TenantID: "t1", ProjectID: "p1", UserID: user, Status: "RUNNING", Progress: int(v), Version: v})
	}
	write(1)
	session := "sess_" + testenv.RandomSuffix(16)
	if _, err := pg.Pool.Exec(ctx, `INSERT INTO sessions (token, tenant_id, user_id, plan, expires_at) VALUES ($1, 't1', $2, 'pro', now() + interval '1 hour')`,
		session, user); err != nil {
		t.Fatal(err)
	}

	rs.Stop()
	proxy.Drop()
	testenv.Eventually(t, "the node not ready", func() bool {
		resp, err := http.Get(n.URL + "/readyz")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusServiceUnavailable
	})

	b := newBrowser(t)
	open := func(token string) (*page, *problems) {
		p := b.tab(t)
		pr := p.watch()
		p.do("navigate", chromedp.Navigate(n.URL+"/healthz")) // any page of the origin
		openEventSource(p, eventsURL(n.URL, task, token))
		return p, pr
	}
	refused, refusedProblems := open(session)
	refused.wait("the refusal", `window.__es.refusals.length > 0`)
	polling, pollingProblems := open(signedToken(t, "t1", user))
	polling.wait("the stream open, polling", `window.__es.modes.includes('polling')`)
	if n := eval[int](polling, `window.__es.refusals.length + window.__es.versions.length`); n != 0 {
		polling.fatalf("%d refusals or versions before any source answers", n)
	}

	rs.Start() // empty: the session and the task are read from PostgreSQL
	proxy.Pass()
	r := firstRefusal(refused)
	if r.Error != "unavailable" || r.RetryAfterMS <= 0 || r.RetryAfter*1000 < r.RetryAfterMS || r.Message == "" {
		refused.fatalf("refusal %+v, want unavailable with its wait", r)
	}
	if r.ReopenedMS < float64(r.RetryAfterMS)-50 {
		refused.fatalf("the EventSource connected again %.0f ms after a refusal of %d ms", r.ReopenedMS, r.RetryAfterMS)
	}
	pages := []struct {
		*page
		pr *problems
	}{{refused, refusedProblems}, {polling, pollingProblems}}
	for _, p := range pages {
		p.wait("version 1", `window.__es.versions.includes(1)`)
		p.wait("push mode", `window.__es.modes.at(-1) === 'push'`)
	}
	write(2)
	pub := fanout.NewRedisPublisher(rs.Client(), keys.Names{})
	publishVersion(t, pub, task, user, 2)
	for _, p := range pages {
		p.wait("version 2", `window.__es.versions.includes(2)`)
		if v := eval[[]int](p.page, `window.__es.versions`); !slices.Equal(v, []int{1, 2}) {
			p.fatalf("versions %v, want 1 and 2, once each", v)
		}
		if closed := eval[int](p.page, `window.__es.failures.filter((f) => f.state === EventSource.CLOSED).length + (window.__source.readyState === EventSource.CLOSED)`); closed > 0 {
			p.fatalf("the EventSource closed for good")
		}
		p.pr.mu.Lock()
		list := slices.Clone(p.pr.list)
		p.pr.mu.Unlock()
		if i := slices.IndexFunc(list, func(s string) bool { return strings.Contains(s, "/v1/events") }); i >= 0 {
			p.fatalf("the stream had a problem: %s", list[i])
		}
	}
}

// A bad token still ends a browser's EventSource at once: the node answers
// 401, and the EventSource fails with readyState CLOSED.
func TestBrowserEventSourceStopsOnBadToken(t *testing.T) {
	n := startNode(t, node.Config{JWTSecret: testSecret})
	p := newBrowser(t).tab(t)
	pr := p.watch()
	p.do("navigate", chromedp.Navigate(n.URL+"/healthz"))
	openEventSource(p, eventsURL(n.URL, "task_1", "not-a-token"))
	p.wait("the EventSource closed", `window.__es.failures.some((f) => f.state === EventSource.CLOSED)`)
	if n := eval[int](p, `window.__es.opens.length + window.__es.refusals.length`); n != 0 {
		p.fatalf("the EventSource opened or was refused in a stream %d times", n)
	}
	pr.mu.Lock()
	list := slices.Clone(pr.list)
	pr.mu.Unlock()
	if !slices.ContainsFunc(list, func(s string) bool { return strings.HasPrefix(s, "HTTP 401 ") }) {
		p.fatalf("the node did not answer 401: %v", list)
	}
}

// drainScript watches one task with the eventsource package's EventSource
// (no pushd.js) and prints each open, refusal, failure and task version as
// a JSON line. It exits when the EventSource closes for good.
const drainScript = `import { EventSource } from 'eventsource';

const [url] = process.argv.slice(2);
const es = new EventSource(url);
const say = (v) => console.log(JSON.stringify(v));
es.addEventListener('open', () => say({ open: true }));
es.addEventListener('task', (e) => say({ version: JSON.parse(e.data).version }));
es.addEventListener('error', (e) => {
  if (typeof e.data === 'string') say({ refused: JSON.parse(e.data).error });
  else say({ failed: es.readyState });
  if (es.readyState === EventSource.CLOSED) process.exit(3);
});
process.on('SIGTERM', () => { es.close(); process.exit(0); });
`

// A standard EventSource in Node.js (the eventsource package) follows a
// task through twenty drains and restarts of the node it streams from, in
// a row: each drain's reconnect meets the draining node, which refuses it
// in a stream; the EventSource waits, reconnects to the node that replaced
// it with its Last-Event-ID, and every change arrives exactly once, those
// made while it was away included, none again from a resume.
func TestEventSourcePackageThroughDrains(t *testing.T) {
	scratch := scratchProject(t, eventSourcePackage)
	if err := os.WriteFile(filepath.Join(scratch, "drain.mjs"), []byte(drainScript), 0o644); err != nil {
		t.Fatal(err)
	}

	redis := testenv.SharedRedis(t)
	pub := fanout.NewRedisPublisher(redis.Client, redis.Names)
	type backend struct {
		*testNode
		proxy *httputil.ReverseProxy
	}
	start := func() backend {
		n := startNode(t, node.Config{RedisURL: redis.URL, KeyPrefix: redis.Names.Prefix, JWTSecret: testSecret,
			SSE: sse.Config{Retry: 300 * time.Millisecond}})
		return backend{n, proxyTo(t, n.URL)}
	}
	// The balancer sends streams to the current node; the first stream that
	// meets it draining goes there still (the balancer has not noticed
	// yet), and from then on to its replacement.
	var mu sync.Mutex
	cur := start()
	var next backend
	refused := make(chan struct{}, 1) // a stream met the draining node and its answer ended
	base := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		to := cur
		switched := r.URL.Path == "/v1/events" && to.Hub().Draining() && next.testNode != nil
		if switched {
			cur, next = next, backend{}
		}
		mu.Unlock()
		to.proxy.ServeHTTP(w, r)
		if switched {
			refused <- struct{}{}
		}
	}))

	task, user := testenv.UniqueID("task"), testenv.UniqueID("user")
	w := startScript(t, scratch, "drain.mjs", eventsURL(base, task, signedToken(t, "t1", user)))
	v := 1
	publishVersion(t, pub, task, user, v)
	w.waitLine(t, `{"version":1}`)
	const drains = 20
	for i := range drains {
		replacement := start()
		mu.Lock()
		old := cur
		next = replacement
		mu.Unlock()
		opens := w.count(`{"open":true}`)
		// The drain tells the stream to reconnect (within 300 ms), which
		// the draining node refuses.
		if err := old.Hub().Shutdown(context.Background(), 300*time.Millisecond); err != nil {
			t.Fatal(err)
		}
		select {
		case <-refused:
		case <-time.After(waitFor):
			t.Fatalf("drain %d: no stream met the draining node", i+1)
		}
		old.shutdown(t)
		// Every other round a change is made while the client is most
		// likely away; in the others nothing moves, and the resumed stream
		// must send nothing. A task's events are its newest state, not a
		// log: two changes in a row may arrive as the second alone, so
		// each is awaited before the next is made.
		if i%2 == 0 {
			v++
			publishVersion(t, pub, task, user, v)
			w.waitLine(t, fmt.Sprintf(`{"version":%d}`, v))
		}
		w.waitCount(t, `{"refused":"draining"}`, i+1)
		// Once the stream is back (its refusal opened one too), a change
		// made now arrives over it, after anything a resume sent again.
		w.waitCount(t, `{"open":true}`, opens+2)
		v++
		publishVersion(t, pub, task, user, v)
		w.waitLine(t, fmt.Sprintf(`{"version":%d}`, v))
	}
	var versions []string
	for _, l := range w.snapshot() {
		if strings.HasPrefix(l, `{"version":`) {
			versions = append(versions, l)
		} else if strings.HasPrefix(l, `{"failed":2`) {
			t.Fatalf("the EventSource closed for good:\n%s", strings.Join(w.snapshot(), "\n"))
		}
	}
	var want []string
	for i := 1; i <= v; i++ {
		want = append(want, fmt.Sprintf(`{"version":%d}`, i))
	}
	if !slices.Equal(versions, want) {
		t.Fatalf("versions received %v, want each of 1 to %d once, in order; the script printed:\n%s", versions, v, strings.Join(w.snapshot(), "\n"))
	}
	if n := w.count(`{"refused":"draining"}`); n != drains {
		t.Fatalf("%d refusals in a stream, want one per drain (%d)", n, drains)
	}
}

// pushd.js reads a refusal in the stream as it reads a 429 it probed for:
// it waits the refusal's retry_after_ms, tells the page with a limited
// event (source connect) and a reconnecting one (http_429), and asks for no
// probe, since the stream said why.
func TestClientReadsARefusalInTheStream(t *testing.T) {
	redis := testenv.SharedRedis(t)
	pub := fanout.NewRedisPublisher(redis.Client, redis.Names)
	n := startNode(t, node.Config{RedisURL: redis.URL, KeyPrefix: redis.Names.Prefix, JWTSecret: testSecret,
		Admission: admission.Config{ConnectUserBurst: 1, ConnectUserRate: 0.5, Timeout: 2 * time.Second}})
	task, user := testenv.UniqueID("task"), testenv.UniqueID("user")
	publishVersion(t, pub, task, user, 1)
	tok := signedToken(t, "t1", user)
	p := newBrowser(t).tab(t)
	pr := p.watch()
	p.do("navigate", chromedp.Navigate(n.URL+"/healthz"))
	holdStream(t, eventsURL(n.URL, task, tok))() // the user's one connect
	eval[bool](p, fmt.Sprintf(`import('/client/pushd.js').then((m) => {
		window.__limited = [];
		window.__reconnecting = [];
		window.__versions = [];
		const c = new m.PushdClient({ token: %q, tasks: [%q], backoffBaseMs: 10 });
		c.addEventListener('limited', (e) => window.__limited.push(e.detail));
		c.addEventListener('reconnecting', (e) => window.__reconnecting.push(e.detail));
		c.addEventListener('task', (e) => window.__versions.push(e.detail.task.version));
		window.__client = c;
		c.start();
		return true;
	})`, tok, task))
	p.wait("version 1", `window.__versions.includes(1)`)
	type limited struct {
		Code         string `json:"code"`
		Source       string `json:"source"`
		Message      string `json:"message"`
		RetryAfter   int64  `json:"retryAfter"`
		RetryAfterMs int64  `json:"retryAfterMs"`
	}
	type reconnecting struct {
		Reason  string  `json:"reason"`
		DelayMs float64 `json:"delayMs"`
	}
	lim := eval[[]limited](p, `window.__limited`)
	rec := eval[[]reconnecting](p, `window.__reconnecting`)
	if len(lim) != 1 || lim[0].Code != "rate_limit_exceeded" || lim[0].Source != "connect" || lim[0].RetryAfterMs <= 0 ||
		lim[0].Message != fmt.Sprintf("too many requests, try again in %d s", lim[0].RetryAfter) {
		p.fatalf("limited events %+v, want one for the connect", lim)
	}
	if len(rec) != 1 || rec[0].Reason != "http_429" || rec[0].DelayMs < float64(lim[0].RetryAfterMs) {
		p.fatalf("reconnecting events %+v, want one of http_429 waiting at least %d ms", rec, lim[0].RetryAfterMs)
	}
	pr.mu.Lock()
	asked := 0
	for _, u := range pr.requests {
		if strings.Contains(u, "/v1/events") {
			asked++
		}
	}
	pr.mu.Unlock()
	if asked != 2 {
		p.fatalf("%d stream requests, want the refused one and the next, no probe", asked)
	}
	publishVersion(t, pub, task, user, 2)
	p.wait("version 2", `window.__versions.includes(2)`)
}
