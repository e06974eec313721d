package web_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	cdplog "github.com/chromedp/cdproto/log"
	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"
	"github.com/chromedp/chromedp/remote"

	"github.com/pushd/pushd/auth"
	"github.com/pushd/pushd/internal/testenv"
	"github.com/pushd/pushd/node"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// waitFor bounds every wait on the page: a condition not met by then fails
// the test with what the page showed.
const waitFor = 30 * time.Second

// demoStep is the simulator's step in these tests: a task takes about 14
// steps, so about 1.5s, long enough to see it move and short enough to wait.
const demoStep = 100 * time.Millisecond

var testSecret = []byte("web-test-secret-0123456789abcdef!")

// testNode is a node on a real listener.
type testNode struct {
	*node.Node
	URL      string
	AdminURL string // the admin listener's: /metrics
	Name     string

	once                sync.Once
	served, adminServed chan error
}

// startNode runs a node on a real listener until the test ends.
func startNode(t *testing.T, cfg node.Config, opts ...node.Option) *testNode {
	t.Helper()
	return startNodeOn(t, "127.0.0.1:0", cfg, opts...)
}

// startNodeOn runs a node listening on addr until the test ends.
func startNodeOn(t *testing.T, addr string, cfg node.Config, opts ...node.Option) *testNode {
	t.Helper()
	if cfg.NodeName == "" {
		cfg.NodeName = "node-" + testenv.RandomSuffix(2)
	}
	if cfg.ReconnectAfter == 0 {
		cfg.ReconnectAfter = 300 * time.Millisecond
	}
	// Before the test's own options, which win: a task moves within a
	// test's wait, and a closed page's stream is noticed within 100ms.
	if cfg.SSE.CheckInterval == 0 {
		cfg.SSE.CheckInterval = 100 * time.Millisecond
	}
	opts = append([]node.Option{node.ForTest(node.TestTuning{DemoStep: demoStep})}, opts...)
	n, err := node.New(context.Background(), cfg, opts...)
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	al, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	tn := &testNode{Node: n, URL: "http://" + l.Addr().String(), AdminURL: "http://" + al.Addr().String(), Name: cfg.NodeName,
		served: make(chan error, 1), adminServed: make(chan error, 1)}
	go func() { tn.served <- n.Serve(l) }()
	go func() { tn.adminServed <- n.ServeAdmin(al) }()
	t.Cleanup(func() { tn.shutdown(t) })
	return tn
}

// shutdown drains the node, as SIGTERM does; once.
func (n *testNode) shutdown(t *testing.T) {
	n.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		n.Shutdown(ctx)
		if err := <-n.served; err != nil {
			t.Errorf("serve: %v", err)
		}
		if err := <-n.adminServed; err != nil {
			t.Errorf("serve admin: %v", err)
		}
	})
}

// serve runs h on a real listener of its own until the test ends: the
// fronts that tests put between the browser and a node.
func serve(t *testing.T, h http.Handler) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	done := make(chan struct{})
	go func() {
		defer close(done)
		srv.Serve(l)
	}()
	t.Cleanup(func() {
		srv.Close()
		<-done
	})
	return "http://" + l.Addr().String()
}

// browser is a Chromium of the test's own, driven over DevTools.
type browser struct {
	ctx context.Context // the browser's first tab; tabs are made from it
}

func newBrowser(t *testing.T) *browser {
	t.Helper()
	b := testenv.StartBrowser(t)
	actx, acancel := remote.NewAllocator(context.Background(), b.DevTools)
	ctx, cancel := chromedp.NewContext(actx)
	t.Cleanup(func() {
		cancel()
		acancel()
	})
	if err := chromedp.Do(ctx); err != nil { // connects, without a timeout: one would end the browser
		t.Fatalf("connect to chromium: %v", err)
	}
	return &browser{ctx: ctx}
}

// page is a tab in a browser context of its own: its own cookies and
// storage, as a separate browser profile would have.
type page struct {
	t   *testing.T
	ctx context.Context
}

func (b *browser) tab(t *testing.T) *page {
	t.Helper()
	ctx, cancel := chromedp.NewContext(b.ctx, chromedp.WithNewBrowserContext())
	t.Cleanup(cancel)
	if err := chromedp.Do(ctx); err != nil {
		t.Fatalf("new tab: %v", err)
	}
	return &page{t: t, ctx: ctx}
}

func (p *page) do(what string, actions ...chromedp.Action[chromedp.Void]) {
	p.t.Helper()
	ctx, cancel := context.WithTimeout(p.ctx, waitFor)
	defer cancel()
	if err := chromedp.Do(ctx, actions...); err != nil {
		p.fatalf("%s: %v", what, err)
	}
}

// open loads the demo page from base with the query and waits for it to
// stream.
func (p *page) open(base, query string) {
	p.t.Helper()
	p.do("navigate", chromedp.Navigate(base+"/demo/?"+query))
	p.waitConn("streaming", "")
	p.install()
}

// eval evaluates a JavaScript expression.
func eval[T any](p *page, expr string) T {
	p.t.Helper()
	ctx, cancel := context.WithTimeout(p.ctx, waitFor)
	defer cancel()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[T](expr, chromedp.EvalAwaitPromise))
	if err != nil {
		p.fatalf("evaluate %s: %v", expr, err)
	}
	return v
}

// wait waits until the expression is truthy on the page.
func (p *page) wait(what, expr string) {
	p.t.Helper()
	ctx, cancel := context.WithTimeout(p.ctx, waitFor+5*time.Second)
	defer cancel()
	// Interval polling, not requestAnimationFrame: a tab that is not in
	// front gets no animation frames.
	_, err := chromedp.Run(ctx, chromedp.Poll[bool](expr,
		chromedp.WithPollingInterval(25*time.Millisecond), chromedp.WithPollingTimeout(waitFor)))
	if err != nil {
		p.fatalf("waiting for %s: %v", what, err)
	}
}

// fatalf fails the test with what the page showed: its connection panel
// and activity log.
func (p *page) fatalf(format string, args ...any) {
	p.t.Helper()
	ctx, cancel := context.WithTimeout(p.ctx, 5*time.Second)
	defer cancel()
	state, _ := chromedp.Run(ctx, chromedp.Evaluate[string](`(() => {
		const c = document.getElementById('conn');
		const cards = [...document.querySelectorAll('.task')].map((e) => e.dataset.taskId + ' ' + e.dataset.status + ' v' + e.dataset.version);
		const notice = document.getElementById('notice');
		return c ? JSON.stringify(c.dataset) + '\ncards: ' + cards.join(', ') + (notice.hidden ? '' : '\nnotice: ' + notice.textContent) +
			'\nlog:\n' + document.getElementById('log').innerText : document.documentElement.outerHTML.slice(0, 2000);
	})()`))
	p.t.Fatalf(format+"\npage:\n%s", append(args, state)...)
}

// waitConn waits for the connection panel to show the client state, and
// the transport when not empty.
func (p *page) waitConn(state, transport string) {
	p.t.Helper()
	cond := fmt.Sprintf(`document.getElementById('conn')?.dataset.state === %q`, state)
	if transport != "" {
		cond += fmt.Sprintf(` && document.getElementById('conn').dataset.transport === %q`, transport)
	}
	p.wait("connection "+state+" "+transport, cond)
}

func (p *page) reconnects() int {
	p.t.Helper()
	return eval[int](p, `Number(document.getElementById('conn').dataset.reconnects)`)
}

// install records every version of every card the page renders, with the
// connection state at that moment, for checks of what the user saw.
func (p *page) install() {
	p.t.Helper()
	eval[bool](p, `(() => {
		if (window.__seen) return true;
		window.__seen = [];
		const keys = new Set();
		const conn = document.getElementById('conn');
		const record = () => {
			for (const c of document.querySelectorAll('.task')) {
				const k = c.dataset.taskId + '|' + c.dataset.version;
				if (!c.dataset.version || keys.has(k)) continue;
				keys.add(k);
				window.__seen.push({id: c.dataset.taskId, status: c.dataset.status, version: Number(c.dataset.version),
					width: c.querySelector('.fill').style.width, conn: conn.dataset.state, mode: conn.dataset.serverMode});
			}
		};
		record();
		new MutationObserver(record).observe(document.getElementById('tasks'), {subtree: true, childList: true, attributes: true});
		return true;
	})()`)
}

// seen is one rendered version of a card.
type seen struct {
	ID      string `json:"id"`
	Status  string `json:"status"`
	Width   string `json:"width"`
	Conn    string `json:"conn"` // the client's state when it was shown
	Mode    string `json:"mode"` // the server's mode when it was shown
	Version int64  `json:"version"`
}

func (p *page) seen(task string) []seen {
	p.t.Helper()
	all := eval[[]seen](p, `window.__seen`)
	var out []seen
	for _, s := range all {
		if s.ID == task {
			out = append(out, s)
		}
	}
	return out
}

// card is what a task card shows.
type card struct {
	ID       string `json:"id"`
	Status   string `json:"status"`
	Stage    string `json:"stage"`
	Pct      string `json:"pct"`
	Queue    string `json:"queue"`
	Provider string `json:"provider"`
	Outcome  string `json:"outcome"`
	Link     string `json:"link"`
	Version  int64  `json:"version"`
	Progress int64  `json:"progress"`
}

func (p *page) cards() []card {
	p.t.Helper()
	return eval[[]card](p, `[...document.querySelectorAll('.task')].map((c) => ({
		id: c.dataset.taskId, status: c.dataset.status, version: Number(c.dataset.version), progress: Number(c.dataset.progress),
		stage: c.querySelector('.stage').textContent, pct: c.querySelector('.pct').textContent,
		queue: c.querySelector('.queue').textContent, provider: c.querySelector('.provider').textContent,
		outcome: c.querySelector('.outcome').textContent, link: c.querySelector('.outcome a')?.getAttribute('href') || ''}))`)
}

func (p *page) card(id string) card {
	p.t.Helper()
	for _, c := range p.cards() {
		if c.ID == id {
			return c
		}
	}
	p.fatalf("no card for %s", id)
	return card{}
}

// start clicks a start button and returns the new task's id.
func (p *page) start(kind string, fail bool) string {
	p.t.Helper()
	before := eval[int](p, `document.querySelectorAll('.task').length`)
	eval[bool](p, fmt.Sprintf(`document.getElementById('fail').checked = %v`, fail))
	button := "start-t2v"
	if kind == "image_to_video" {
		button = "start-i2v"
	}
	p.do("click "+button, chromedp.Click(chromedp.ID(button)))
	p.wait("a new card", fmt.Sprintf(`document.querySelectorAll('.task').length > %d`, before))
	return eval[string](p, `document.querySelector('.task').dataset.taskId`)
}

// waitStatus waits for the card of task to show status.
func (p *page) waitStatus(task, status string) {
	p.t.Helper()
	p.wait(task+" "+status, fmt.Sprintf(`document.querySelector('[data-task-id=%q]')?.dataset.status === %q`, task, status))
}

// waitTerminal waits for every card to show a final status.
func (p *page) waitAllTerminal() {
	p.t.Helper()
	p.wait("every task finished", `[...document.querySelectorAll('.task')].every((c) => ['SUCCEEDED', 'FAILED', 'CANCELED'].includes(c.dataset.status))`)
}

// checkNewest checks that every card shows the version the server holds.
func (p *page) checkNewest(base, token string) {
	p.t.Helper()
	cards := p.cards()
	if len(cards) == 0 {
		p.fatalf("no cards")
	}
	ids := make([]string, len(cards))
	for i, c := range cards {
		ids[i] = c.ID
	}
	truth := serverVersions(p.t, base, token, ids)
	for _, c := range cards {
		if truth[c.ID] == 0 || c.Version != truth[c.ID] {
			p.fatalf("task %s shows v%d, the server has v%d", c.ID, c.Version, truth[c.ID])
		}
	}
}

// serverVersions reads the tasks' versions from the node.
func serverVersions(t *testing.T, base, token string, ids []string) map[string]int64 {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, base+"/v1/tasks?ids="+url.QueryEscape(strings.Join(ids, ",")), nil)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /v1/tasks: %d %s", resp.StatusCode, body)
	}
	var list struct {
		Tasks []struct {
			TaskID  string `json:"task_id"`
			Version int64  `json:"version"`
		} `json:"tasks"`
	}
	if err := json.Unmarshal(body, &list); err != nil {
		t.Fatal(err)
	}
	out := make(map[string]int64)
	for _, s := range list.Tasks {
		out[s.TaskID] = s.Version
	}
	return out
}

// demoToken gets a token from an embedded node's GET /demo/token.
func demoToken(t *testing.T, base, tenant, user string) string {
	t.Helper()
	resp, err := http.Get(base + "/demo/token?tenant=" + tenant + "&user=" + user)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var v struct{ Token string }
	if err := json.NewDecoder(resp.Body).Decode(&v); err != nil || v.Token == "" {
		t.Fatalf("demo token: %d %v", resp.StatusCode, err)
	}
	return v.Token
}

// signedToken is a token for nodes configured with testSecret.
func signedToken(t *testing.T, tenant, user string) string {
	t.Helper()
	tok, err := auth.NewSigner(testSecret).Sign(auth.Principal{TenantID: tenant, UserID: user, ExpiresAt: time.Now().Add(time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

func regexpMatch(re, s string) bool { return regexp.MustCompile(re).MatchString(s) }

// problems collects what a person would see in the DevTools of a tab: HTTP
// responses of 400 and up, requests that failed without being canceled,
// console errors and uncaught exceptions; and every URL the tab asked for.
type problems struct {
	mu       sync.Mutex
	list     []string
	requests []string
}

// watch starts collecting the tab's problems, from now until the test ends.
func (p *page) watch() *problems {
	p.t.Helper()
	var pr problems
	err := chromedp.Listen(p.ctx, func(ev any) {
		// Called on the tab's reading goroutine: record and return.
		pr.mu.Lock()
		defer pr.mu.Unlock()
		switch ev := ev.(type) {
		case *network.EventRequestWillBeSent:
			pr.requests = append(pr.requests, ev.Request.URL)
		case *network.EventResponseReceived:
			if ev.Response.Status >= 400 {
				pr.list = append(pr.list, fmt.Sprintf("HTTP %d %s", ev.Response.Status, ev.Response.URL))
			}
		case *network.EventLoadingFailed:
			// A stream the client closes to open another is canceled, not failed.
			if !ev.Canceled {
				pr.list = append(pr.list, fmt.Sprintf("request failed (%s): %s", ev.Type, ev.ErrorText))
			}
		case *runtime.EventExceptionThrown:
			pr.list = append(pr.list, "exception: "+ev.ExceptionDetails.Text+" "+exceptionText(ev.ExceptionDetails))
		case *runtime.EventConsoleAPICalled:
			if ev.Type == runtime.ConsoleAPICalledTypeError || ev.Type == runtime.ConsoleAPICalledTypeAssert {
				var args []string
				for _, a := range ev.Args {
					args = append(args, string(a.Value)+a.Description)
				}
				pr.list = append(pr.list, "console."+string(ev.Type)+": "+strings.Join(args, " "))
			}
		case *cdplog.EventEntryAdded:
			if ev.Entry.Level == cdplog.EntryLevelError {
				pr.list = append(pr.list, "log: "+ev.Entry.Text+" "+ev.Entry.URL)
			}
		}
	})
	if err != nil {
		p.fatalf("listen: %v", err)
	}
	return &pr
}

func exceptionText(d *runtime.ExceptionDetails) string {
	if d.Exception == nil {
		return ""
	}
	return d.Exception.Description
}

// check fails the test with every problem collected so far.
func (pr *problems) check(p *page, when string) {
	p.t.Helper()
	pr.mu.Lock()
	list := slices.Clone(pr.list)
	pr.mu.Unlock()
	if len(list) > 0 {
		p.fatalf("%s, the tab had problems:\n%s", when, strings.Join(list, "\n"))
	}
}

// asked reports whether the tab requested a URL whose path is path.
func (pr *problems) asked(path string) bool {
	pr.mu.Lock()
	defer pr.mu.Unlock()
	return slices.ContainsFunc(pr.requests, func(raw string) bool {
		u, err := url.Parse(raw)
		return err == nil && u.Path == path
	})
}
