package web_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/pushd/pushd/auth"
	"github.com/pushd/pushd/hub"
	"github.com/pushd/pushd/internal/httperr"
	"github.com/pushd/pushd/node"
	"github.com/pushd/pushd/snapshot"
)

// The client's pure helpers, run in Chromium from the served module.
func TestClientHelpersInTheBrowser(t *testing.T) {
	n := startNode(t, node.Config{})
	b := newBrowser(t)
	p := b.tab(t)
	p.do("navigate", chromedp.Navigate(n.URL+"/healthz")) // any page of the origin
	failures := eval[[]string](p, `import('/client/pushd.js').then((m) => {
		const fails = [];
		const check = (what, ok) => { if (!ok) fails.push(what); };
		// Full jitter: below min(max, base * 2^attempt), from 0 up.
		check('jitter 0 at random 0', m.fullJitter(3, 500, 30000, () => 0) === 0);
		check('jitter attempt 0 below base', m.fullJitter(0, 500, 30000, () => 0.999) < 500);
		check('jitter doubles', m.fullJitter(2, 500, 30000, () => 0.999) >= 1990 && m.fullJitter(2, 500, 30000, () => 0.999) < 2000);
		check('jitter capped', m.fullJitter(40, 500, 30000, () => 0.999) < 30000 && m.fullJitter(40, 500, 30000, () => 0.999) > 29000);
		let spread = new Set();
		for (let i = 0; i < 50; i++) spread.add(m.fullJitter(5, 500, 30000));
		check('jitter spreads', spread.size > 40);
		check('retry-after seconds', m.parseRetryAfter('2') === 2000);
		check('retry-after date', m.parseRetryAfter(new Date(Date.now() + 3000).toUTCString(), Date.now()) > 1000);
		check('retry-after garbage', m.parseRetryAfter('soon') === null && m.parseRetryAfter(null) === null);
		// A wait a server names is at most MAX_SERVER_WAIT_MS; one that is not a finite number from 0 up is none.
		check('ceilings', m.MAX_SERVER_WAIT_MS === 300000 && m.MAX_HEARTBEAT_MS === 300000);
		check('retry-after capped', m.parseRetryAfter('3000000') === 300000 && m.parseRetryAfter(new Date(Date.now() + 86400000).toUTCString()) === 300000);
		check('retry-after past a number', m.parseRetryAfter('9'.repeat(400)) === null);
		const capped = m.limitOf({ error: 'rate_limit_exceeded', retry_after: 3000000, retry_after_ms: 3e9 });
		check('limit capped', capped.retryAfter === 300 && capped.retryAfterMs === 300000 && capped.message === 'too many requests, try again in 300 s');
		const junk = m.limitOf(JSON.parse('{"code":"rate_limit_exceeded","retry_after":"30","retry_after_ms":-5}'), 2500);
		check('limit of junk takes the header', junk.retryAfter === 3 && junk.retryAfterMs === 2500);
		const huge = m.limitOf(JSON.parse('{"code":"rate_limit_exceeded","retry_after_ms":1e400}'));
		check('limit of Infinity is none', huge.retryAfter === 1 && huge.retryAfterMs === 1000);
		check('terminal', m.isTerminal('FAILED') && !m.isTerminal('RUNNING'));
		// Refusals for a limit, in the platform's words, with the server's seconds.
		check('limit message', m.limitMessage(30) === 'too many requests, try again in 30 s');
		const body = m.limitOf({ error: 'rate_limit_exceeded', retry_after: 30, retry_after_ms: 29001, message: 'x' });
		check('limit of a 429 body', body && body.code === 'rate_limit_exceeded' && body.retryAfter === 30 && body.retryAfterMs === 29001 &&
			body.message === 'too many requests, try again in 30 s');
		const cap = m.limitOf({ error: 'too_many_connections', retry_after: 5, retry_after_ms: 5000 });
		check('limit of a cap', cap && cap.code === 'too_many_connections' && cap.message === 'too many requests, try again in 5 s');
		const ev = m.limitOf({ code: 'rate_limit_exceeded', task_id: 'a', retry_after_ms: 420 });
		check('limit of an event without seconds rounds up', ev && ev.retryAfter === 1 && ev.retryAfterMs === 420);
		const hdr = m.limitOf({ code: 'rate_limit_exceeded' }, 2500);
		check('limit of a bare refusal takes the header', hdr && hdr.retryAfter === 3 && hdr.retryAfterMs === 2500);
		check('not a limit', m.limitOf({ code: 'not_found' }) === null && m.limitOf({ error: 'rate_limited' }) === null && m.limitOf(null) === null);
		// Versions only go up, whatever order snapshots come in.
		const c = new m.PushdClient({ token: 'x' });
		const shown = [];
		c.addEventListener('task', (e) => shown.push(e.detail.task.version));
		for (const v of [2, 1, 2, 5, 3, 6]) c.offer({ task_id: 'a', version: v, status: 'RUNNING' });
		check('newest wins: ' + shown.join(','), shown.join(',') === '2,5,6' && c.task('a').version === 6);
		check('drops counted', c.stats.dropped === 3);
		const idle = new m.PushdClient({ token: 'x' });
		check('idle without subscriptions', (idle.start(), idle.state === 'idle'));
		idle.close();
		check('closed', idle.state === 'closed');
		return fails;
	})`)
	if len(failures) > 0 {
		t.Fatalf("client checks failed: %v", failures)
	}
}

// rateLimiter answers the first stream requests with 429 and Retry-After,
// as a rate limit in front of the node would, and records when each stream
// request came.
type rateLimiter struct {
	next    http.Handler
	limited int // requests to refuse

	mu    sync.Mutex
	times []time.Time
}

func (rl *rateLimiter) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != "/v1/events" && r.URL.Path != "/v1/ws" {
		rl.next.ServeHTTP(w, r)
		return
	}
	rl.mu.Lock()
	rl.times = append(rl.times, time.Now())
	refuse := len(rl.times) <= rl.limited
	rl.mu.Unlock()
	if refuse {
		httperr.TooManyRequests(w, httperr.RateLimitExceeded, 2*time.Second, "too many connections")
		return
	}
	rl.next.ServeHTTP(w, r)
}

// An EventSource or WebSocket cannot read a 429's Retry-After; the client
// probes for it and waits that long before the next attempt, although its
// own backoff would come back sooner, and the page shows the platform's
// message with the 429's seconds.
func TestClientHonoursRetryAfterOn429(t *testing.T) {
	b := newBrowser(t)
	for _, transport := range transports {
		t.Run(transport, func(t *testing.T) {
			n := startNode(t, node.Config{})
			// Two refusals: the connection and the client's probe of it.
			rl := &rateLimiter{next: n.Handler(), limited: 2}
			base := serve(t, rl)
			p := b.tab(t)
			p.open(base, "transport="+transport+"&backoff_ms=50")
			if log := p.logText(); !strings.Contains(log, "(http_429)") {
				p.fatalf("the activity log does not show the 429")
			}
			const message = "too many requests, try again in 2 s"
			if log := p.logText(); !strings.Contains(log, "Server: "+message+" (connecting)") {
				p.fatalf("the activity log does not show %q", message)
			}
			if got := eval[string](p, `document.getElementById('conn').dataset.limited`); got != message {
				p.fatalf("the page's limit %q, want %q", got, message)
			}
			rl.mu.Lock()
			defer rl.mu.Unlock()
			if len(rl.times) < 3 {
				p.fatalf("%d stream requests, want the refused one, the probe and a retry", len(rl.times))
			}
			if gap := rl.times[2].Sub(rl.times[1]); gap < 1900*time.Millisecond {
				p.fatalf("retried %v after a 429 with Retry-After: 2", gap)
			}
		})
	}
}

// A client over a real connection fires each state change once: one
// "connecting" and one "streaming" per connection (a hello used to fire
// "streaming" twice), one event when the server's mode changes, and none
// that repeats the one before it.
func TestClientFiresEachStateChangeOnce(t *testing.T) {
	n := startNode(t, node.Config{})
	b := newBrowser(t)
	for _, transport := range transports {
		t.Run(transport, func(t *testing.T) {
			tenant := "once-" + transport
			token := demoToken(t, n.URL, tenant, "u1")
			p := b.tab(t)
			p.do("navigate", chromedp.Navigate(n.URL+"/healthz")) // any page of the origin
			startClient(p, fmt.Sprintf(`{ token: %q, transport: %q, projects: ['p1'] }`, token, transport))
			p.wait("streaming", `window.__client.state === 'streaming'`)
			// A task started now arrives over the stream after anything the
			// hello fired: by then every state event of the connection is in.
			started := startDemoTask(t, n.URL, token, "p1")
			p.wait("the task over the stream", fmt.Sprintf(`window.__tasks.some((t) => t.task_id === %q)`, started))
			checkStates(p, "connecting streaming")

			n.Hub().Lost(errors.New("test: bus lost"))
			p.wait("the server's polling mode", `window.__client.serverMode === 'polling'`)
			n.Hub().Restored()
			p.wait("the server's push mode", `window.__states.at(-1).serverMode === 'push'`)
			checkStates(p, "connecting streaming streaming/polling streaming/push")

			eval[bool](p, `(window.__client.interrupt(), true)`)
			p.wait("streaming again", `window.__states.length > 4 && window.__client.state === 'streaming'`)
			started = startDemoTask(t, n.URL, token, "p1")
			p.wait("a task over the new stream", fmt.Sprintf(`window.__tasks.some((t) => t.task_id === %q)`, started))
			checkStates(p, "connecting streaming streaming/polling streaming/push connecting streaming")
			eval[bool](p, `(window.__client.close(), true)`)
		})
	}
}

// Over WebSocket, the client refreshes a JWT on the open connection before
// its exp with the token function's next token: the connection outlives
// the first token, with no reconnect, and still delivers.
func TestClientRefreshesTheTokenOverWebSocket(t *testing.T) {
	n := startNode(t, node.Config{JWTSecret: testSecret, Demo: true})
	b := newBrowser(t)
	sign := func(exp time.Time) string {
		grant, _ := snapshot.ParseGrant([]string{"p1"})
		tok, err := auth.NewSigner(testSecret).Sign(auth.Principal{TenantID: "refresh", UserID: "u1", ExpiresAt: exp, Grant: grant})
		if err != nil {
			t.Fatal(err)
		}
		return tok
	}
	expires := time.Now().Add(4 * time.Second).Truncate(time.Second)
	short, long := sign(expires), sign(time.Now().Add(time.Hour))
	p := b.tab(t)
	p.do("navigate", chromedp.Navigate(n.URL+"/healthz"))
	// The token function gives the short token first, the long one after.
	startClient(p, fmt.Sprintf(`{ token: (() => { const tokens = [%q, %q]; let calls = 0; return async () => tokens[Math.min(calls++, 1)]; })(), transport: 'ws', projects: ['p1'] }`, short, long))
	p.wait("streaming", `window.__client.state === 'streaming'`)
	// Past the first token's exp and the node's next expiry check.
	p.wait("the first token's exp passed", fmt.Sprintf(`Date.now() > %d`, expires.Add(1500*time.Millisecond).UnixMilli()))
	started := startDemoTask(t, n.URL, long, "p1")
	p.wait("a task over the refreshed connection", fmt.Sprintf(`window.__tasks.some((t) => t.task_id === %q)`, started))
	checkStates(p, "connecting streaming")
	if st := n.Hub().Stats(); st.Refreshes != 1 || st.Cuts[hub.CutTokenExpired] != 0 {
		p.fatalf("%d refreshes and %d connections closed at exp, want 1 and 0", st.Refreshes, st.Cuts[hub.CutTokenExpired])
	}
	eval[bool](p, `(window.__client.close(), true)`)
}

// A refused token is told to the page, not hidden behind reconnects and
// polling: with a token string, which cannot change, the client says
// error unauthorized (status 401) and closes after the one connection and
// its probe, polling nothing; with a token function it says the same,
// asks the function again and streams with the new token.
func TestClientTellsThePageOfARefusedToken(t *testing.T) {
	n := startNode(t, node.Config{})
	b := newBrowser(t)
	const bad = "not.a.token"
	type refusal struct {
		Code    string `json:"code"`
		Message string `json:"message"`
		Status  int    `json:"status"`
	}
	wantRefusal := func(p *page) {
		p.t.Helper()
		errs := eval[[]refusal](p, `window.__errors`)
		if len(errs) != 1 || errs[0].Code != "unauthorized" || errs[0].Status != http.StatusUnauthorized || errs[0].Message == "" {
			p.fatalf("error events %+v, want one unauthorized with status 401 and the server's message", errs)
		}
	}
	for _, transport := range transports {
		t.Run(transport+"/a token string", func(t *testing.T) {
			counted := &rateLimiter{next: n.Handler()}
			base := serve(t, counted)
			p := b.tab(t)
			p.do("navigate", chromedp.Navigate(base+"/healthz"))
			startClient(p, fmt.Sprintf(`{ token: %q, transport: %q, tasks: ['a1'], backoffBaseMs: 50 }`, bad, transport))
			p.wait("closed", `window.__client.state === 'closed'`)
			wantRefusal(p)
			if got := eval[string](p, `window.__states.at(-1).reason`); got != "http_401" {
				p.fatalf("closed for %q, want http_401", got)
			}
			if polls := eval[int](p, `window.__client.stats.polls`); polls != 0 {
				p.fatalf("%d polls with a refused token, want none", polls)
			}
			counted.mu.Lock()
			defer counted.mu.Unlock()
			if len(counted.times) != 2 {
				p.fatalf("%d stream requests, want the refused one and its probe", len(counted.times))
			}
		})
		t.Run(transport+"/a token function", func(t *testing.T) {
			good := demoToken(t, n.URL, "refused-"+transport, "u1")
			p := b.tab(t)
			p.do("navigate", chromedp.Navigate(n.URL+"/healthz"))
			startClient(p, fmt.Sprintf(`{ token: (() => { const tokens = [%q, %q]; let calls = 0; return async () => tokens[Math.min(calls++, 1)]; })(), transport: %q, projects: ['p1'], backoffBaseMs: 50 }`, bad, good, transport))
			p.wait("streaming", `window.__client.state === 'streaming'`)
			started := startDemoTask(t, n.URL, good, "p1")
			p.wait("the task over the stream", fmt.Sprintf(`window.__tasks.some((t) => t.task_id === %q)`, started))
			wantRefusal(p)
			checkStates(p, "connecting streaming")
			eval[bool](p, `(window.__client.close(), true)`)
		})
	}
}

// startClient starts a PushdClient with options (a JavaScript object) on
// the page, as window.__client, recording its state events in
// window.__states, its tasks in window.__tasks and its error events in
// window.__errors.
func startClient(p *page, options string) {
	p.t.Helper()
	eval[bool](p, `import('/client/pushd.js').then((m) => {
		const c = new m.PushdClient(`+options+`);
		window.__states = [];
		window.__tasks = [];
		window.__errors = [];
		c.addEventListener('state', (e) => window.__states.push(e.detail));
		c.addEventListener('task', (e) => window.__tasks.push(e.detail.task));
		c.addEventListener('error', (e) => window.__errors.push(e.detail));
		window.__client = c;
		c.start();
		return true;
	})`)
}

// checkStates checks the client's state events so far: their states, with
// the server's mode after a slash when only the mode changed, and that no
// event repeats the one before it.
func checkStates(p *page, want string) {
	p.t.Helper()
	type state struct {
		State      string `json:"state"`
		ServerMode string `json:"serverMode"`
		Reason     string `json:"serverReason"`
		Node       string `json:"node"`
		Transport  string `json:"transport"`
	}
	states := eval[[]state](p, `window.__states`)
	var got []string
	for i, s := range states {
		word := s.State
		if i > 0 {
			prev := states[i-1]
			if s == prev {
				p.fatalf("state event %d repeats the one before: %+v", i, states)
			}
			if s.State == prev.State {
				word += "/" + s.ServerMode
			}
		}
		got = append(got, word)
	}
	if strings.Join(got, " ") != want {
		p.fatalf("state events %q, want %q: %+v", strings.Join(got, " "), want, states)
	}
}

// startDemoTask starts a simulated task in the token's tenant and returns
// its id.
func startDemoTask(t *testing.T, base, token, project string) string {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, base+"/demo/tasks", strings.NewReader(`{"project_id":"`+project+`"}`))
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var body struct {
		Task struct {
			TaskID string `json:"task_id"`
		} `json:"task"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil || resp.StatusCode != http.StatusCreated {
		t.Fatalf("start a task: %d %v", resp.StatusCode, err)
	}
	return body.Task.TaskID
}
