package web_test

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/pushd/pushd/internal/testenv"
	"github.com/pushd/pushd/node"
)

var transports = []string{"sse", "ws"}

// checkWalkShown checks what the page rendered for a task that succeeded:
// it started queued, passed through every stage, and its progress bar
// grew step by step to full.
func checkWalkShown(t *testing.T, p *page, task string) {
	t.Helper()
	history := p.seen(task)
	statuses := map[string]bool{}
	var widths []int
	for _, s := range history {
		statuses[s.Status] = true
		w, err := strconv.Atoi(strings.TrimSuffix(s.Width, "%"))
		if err != nil {
			p.fatalf("width %q of %s v%d", s.Width, task, s.Version)
		}
		if len(widths) > 0 && w < widths[len(widths)-1] {
			p.fatalf("the progress bar of %s went back: %v then %d", task, widths, w)
		}
		widths = append(widths, w)
	}
	if len(history) == 0 || history[0].Status != "QUEUED" || history[len(history)-1].Status != "SUCCEEDED" {
		p.fatalf("%s was shown as %+v, want QUEUED first and SUCCEEDED last", task, history)
	}
	for _, s := range []string{"RUNNING", "PROVIDER_SUBMITTED", "POST_PROCESSING"} {
		if !statuses[s] {
			p.fatalf("%s was never shown %s: %+v", task, s, history)
		}
	}
	moving := 0
	for i := 1; i < len(widths); i++ {
		if widths[i] > widths[i-1] && widths[i] < 100 {
			moving++
		}
	}
	if moving < 3 || widths[len(widths)-1] != 100 {
		p.fatalf("the progress bar of %s did not move step by step to 100%%: %v", task, widths)
	}
}

func TestStartedTaskRunsToSucceededOnScreen(t *testing.T) {
	base := startNode(t, node.Config{}).URL
	b := newBrowser(t)
	for _, transport := range transports {
		t.Run(transport, func(t *testing.T) {
			p := b.tab(t)
			p.open(base, "tenant=t-"+transport+"&transport="+transport)
			p.waitConn("streaming", transport)

			task := p.start("text_to_video", false)
			p.waitStatus(task, "SUCCEEDED")
			checkWalkShown(t, p, task)

			c := p.card(task)
			if c.Provider != "veo · veo-3" || c.Pct != "100%" || !strings.HasPrefix(c.Link, "/demo/assets/asset_"+task) {
				p.fatalf("finished card %+v", c)
			}
			if mode := eval[string](p, `document.getElementById('conn').dataset.serverMode`); mode != "push" {
				p.fatalf("server mode %q, want push", mode)
			}
			p.checkNewest(base, demoToken(t, base, "t-"+transport, "demo-user"))
		})
	}
}

// pasteToken answers the page's token dialog with token.
func (p *page) pasteToken(token string) {
	p.t.Helper()
	p.wait("the token dialog", `document.getElementById('token-dialog').open`)
	eval[bool](p, fmt.Sprintf(`(document.getElementById('token-input').value = %q, true)`, token))
	p.do("connect with the token", chromedp.Click(chromedp.ID("token-submit")))
}

// checkFailedCard checks that a failed task's card says it failed, with the
// provider's reason, and no progress.
func checkFailedCard(p *page, task string) {
	p.t.Helper()
	c := p.card(task)
	if c.Status != "FAILED" || c.Stage != "Failed" || c.Pct != "" ||
		c.Outcome != "The provider rejected the generation request. (provider_content_rejected)" {
		p.fatalf("failed card %+v", c)
	}
	if badge := eval[string](p, fmt.Sprintf(`document.querySelector('[data-task-id=%q] .status').textContent`, task)); badge != "Failed" {
		p.fatalf("failed card's badge %q", badge)
	}
}

// demoRun is what TestDemoOn* do on a page that streams: start a task that
// succeeds and one that fails, check what the page shows of them, reload,
// and check that both cards come back in their final states. It returns
// the two task ids.
func demoRun(t *testing.T, p *page, pr *problems, base, token string) (ok, bad string) {
	t.Helper()
	ok = p.start("text_to_video", false)
	bad = p.start("image_to_video", true)
	p.waitStatus(ok, "SUCCEEDED")
	p.waitStatus(bad, "FAILED")
	checkWalkShown(t, p, ok)
	checkFailedCard(p, bad)
	// The log names a task by its kind and prompt (the page's default,
	// cut at a word), and marks each line with the task's id.
	const prompt = "“A paper boat drifting down a rainy…”"
	for task, wants := range map[string][]string{
		ok: {
			"Text → Video " + prompt + ": Queued",
			"Text → Video " + prompt + ": Queued → Running",
			"Text → Video " + prompt + ": Running → Generating",
			"Text → Video " + prompt + ": Generating → Finishing",
			"Text → Video " + prompt + " is ready",
		},
		bad: {"Image → Video " + prompt + " failed: The provider rejected the generation request. (provider_content_rejected)"},
	} {
		log := p.logOf(task)
		for _, want := range wants {
			if !strings.Contains(log, want) {
				p.fatalf("the activity log's lines of %s lack %q:\n%s", task, want, log)
			}
		}
	}
	pr.check(p, "after two tasks")
	return ok, bad
}

// checkReloaded checks the cards after a reload: the tasks the page
// started, in their final states, with what the page asked for.
func checkReloaded(p *page, base, token, ok, bad, prompt string) {
	p.t.Helper()
	p.waitStatus(ok, "SUCCEEDED")
	p.waitStatus(bad, "FAILED")
	checkFailedCard(p, bad)
	if c := p.card(ok); c.Pct != "100%" || !strings.HasPrefix(c.Link, "/demo/assets/asset_"+ok) {
		p.fatalf("reloaded finished card %+v", c)
	}
	if got := eval[string](p, fmt.Sprintf(`document.querySelector('[data-task-id=%q] .prompt').textContent`, ok)); got != prompt {
		p.fatalf("reloaded card's prompt %q, want %q", got, prompt)
	}
	if got := eval[string](p, fmt.Sprintf(`document.querySelector('[data-task-id=%q] .kind').textContent`, bad)); got != "Image → Video" {
		p.fatalf("reloaded card's kind %q", got)
	}
	if log := p.logText(); strings.Contains(log, ok) || strings.Contains(log, bad) {
		p.fatalf("tasks that ended before the reload are logged as news:\n%s", log)
	}
	p.checkNewest(base, token)
}

const defaultPrompt = "A paper boat drifting down a rainy street at dusk, cinematic"

// The demo on a node with Redis and PostgreSQL, as `pushd --demo` with a
// secret runs it: the page asks for a token and shows whom it names; the
// simulator commits its tasks to PostgreSQL, so a reload after their
// snapshots left Redis lists them from there; and nothing on the way
// answers an error or logs one.
func TestDemoOnRedisAndPostgres(t *testing.T) {
	redis := testenv.SharedRedis(t)
	pg := testenv.Database(t)
	n := startNode(t, node.Config{RedisURL: redis.URL, KeyPrefix: redis.Names.Prefix, DatabaseURL: pg.URL, JWTSecret: testSecret, Demo: true})
	b := newBrowser(t)
	for _, transport := range transports {
		t.Run(transport, func(t *testing.T) {
			project := testenv.UniqueID("campaign")
			token := signedToken(t, "t1", "u1")
			p := b.tab(t)
			pr := p.watch()
			// The URL names another tenant and user: the header must follow
			// the token, not the URL.
			p.do("navigate", chromedp.Navigate(n.URL+"/demo/?tenant=demo&user=demo-user&project="+project+"&transport="+transport))
			p.pasteToken(token)
			p.waitConn("streaming", transport)
			p.install()
			p.wait("the token's identity in the header", `document.getElementById('who').textContent === 'u1 · tenant t1'`)
			pr.check(p, "on load")

			ok, bad := demoRun(t, p, pr, n.URL, token)

			// PostgreSQL holds both tasks at their final versions.
			versions := serverVersions(t, n.URL, token, []string{ok, bad})
			for _, id := range []string{ok, bad} {
				var status string
				var version int64
				if err := pg.Pool.QueryRow(t.Context(), `SELECT status, version FROM generation_tasks WHERE id = $1 AND tenant_id = 't1' AND project_id = $2`, id, project).Scan(&status, &version); err != nil {
					t.Fatalf("task %s in PostgreSQL: %v", id, err)
				}
				if version != versions[id] {
					t.Fatalf("task %s: PostgreSQL has %s v%d, the node serves v%d", id, status, version, versions[id])
				}
			}
			// Their snapshots leave Redis, as they do by status TTL.
			for _, id := range []string{ok, bad} {
				if err := redis.Client.Del(t.Context(), redis.Names.Snapshot(id), redis.Names.SnapshotMeta(id)).Err(); err != nil {
					t.Fatal(err)
				}
			}

			p.do("reload", chromedp.Reload())
			p.waitConn("streaming", transport)
			if eval[bool](p, `document.getElementById('token-dialog').open`) {
				p.fatalf("the reloaded page asks for a token again")
			}
			p.wait("the token's identity in the header", `document.getElementById('who').textContent === 'u1 · tenant t1'`)
			checkReloaded(p, n.URL, token, ok, bad, defaultPrompt)
			pr.check(p, "after the reload")
			if pr.asked("/demo/token") {
				p.fatalf("the page asked a node that serves no demo tokens for one")
			}
		})
	}
}

// The same in the embedded mode: the page gets its token from the node,
// and a reload lists the project from the in-memory store.
func TestDemoEmbedded(t *testing.T) {
	n := startNode(t, node.Config{})
	b := newBrowser(t)
	for _, transport := range transports {
		t.Run(transport, func(t *testing.T) {
			tenant := "emb-" + transport
			p := b.tab(t)
			pr := p.watch()
			p.open(n.URL, "tenant="+tenant+"&user=u1&transport="+transport)
			p.wait("the token's identity in the header", fmt.Sprintf(`document.getElementById('who').textContent === 'u1 · tenant %s'`, tenant))
			pr.check(p, "on load")
			token := demoToken(t, n.URL, tenant, "u1")

			ok, bad := demoRun(t, p, pr, n.URL, token)

			p.do("reload", chromedp.Reload())
			p.waitConn("streaming", transport)
			checkReloaded(p, n.URL, token, ok, bad, defaultPrompt)
			pr.check(p, "after the reload")
			if !pr.asked("/demo/token") {
				p.fatalf("the page did not get its token from the node")
			}
		})
	}
}

// The demo is a careful page: its answers carry a strict
// Content-Security-Policy (no inline script), forbid framing and send no
// Referer; and every string of a snapshot is rendered as text: HTML in any
// field stays inert, and an output_url of javascript: or data: becomes no
// link and no image.
func TestDemoRendersSnapshotsInert(t *testing.T) {
	n := startNode(t, node.Config{})
	for _, path := range []string{"/demo/", "/demo/app.js", "/demo/config"} {
		resp, _ := do(t, http.MethodGet, n.URL+path, "", "")
		csp := resp.Header.Get("Content-Security-Policy")
		for _, want := range []string{"default-src 'self'", "script-src 'self'", "frame-ancestors 'none'", "object-src 'none'"} {
			if !strings.Contains(csp, want) {
				t.Errorf("%s: Content-Security-Policy %q lacks %q", path, csp, want)
			}
		}
		if strings.Contains(csp, "unsafe-") {
			t.Errorf("%s: Content-Security-Policy %q allows something unsafe", path, csp)
		}
		if got := resp.Header.Get("X-Frame-Options"); got != "DENY" {
			t.Errorf("%s: X-Frame-Options %q, want DENY", path, got)
		}
		if got := resp.Header.Get("Referrer-Policy"); got != "no-referrer" {
			t.Errorf("%s: Referrer-Policy %q, want no-referrer", path, got)
		}
	}

	b := newBrowser(t)
	p := b.tab(t)
	pr := p.watch()
	const tenant = "inert"
	p.open(n.URL, "tenant="+tenant)
	hostile := map[string]string{
		"stage":    `<img src=x onerror="window.__pwned='stage'">`,
		"provider": `<b id="injected">bold</b>`,
		"model":    `<script>window.__pwned='model'</script>`,
	}
	publish := func(id, status, extra string) {
		d := fmt.Sprintf(`{"task_id":%q,"tenant_id":%q,"project_id":"launch-campaign","user_id":"demo-user","status":%q,"progress":100,`+
			`"stage":%q,"provider":%q,"model":%q,"version":1,"updated_at":%d%s}`,
			id, tenant, status, hostile["stage"], hostile["provider"], hostile["model"], time.Now().UnixMilli(), extra)
		if resp, body := do(t, http.MethodPost, n.URL+"/v1/publish", "", d); resp.StatusCode != http.StatusOK {
			t.Fatalf("publish %s: %d %s", id, resp.StatusCode, body)
		}
	}
	publish("inert_js", "SUCCEEDED", `,"output_asset_id":"a1","output_url":"javascript:window.__pwned='link'"`)
	publish("inert_data", "SUCCEEDED", `,"output_asset_id":"a2","output_url":"data:text/html,<script>window.__pwned='data'</script>"`)
	publish("inert_failed", "FAILED", `,"error_code":"<i id=\"injected2\">e</i>","error_message":"<img src=y onerror=\"window.__pwned='error'\">"`)
	for _, id := range []string{"inert_js", "inert_data", "inert_failed"} {
		p.wait("the card of "+id, fmt.Sprintf(`document.querySelector('.task[data-task-id=%q][data-version="1"]') !== null`, id))
	}
	if got := eval[string](p, `String(window.__pwned ?? '') + [...document.querySelectorAll(
		'#injected, #injected2, .task script, .task img[src="x"], .task img[src="y"], a[href^="javascript:"], a[href^="data:"], img[src^="javascript:"], img[src^="data:"]')]
		.map((e) => e.outerHTML).join(' ')`); got != "" {
		p.fatalf("hostile snapshot fields became live: %s", got)
	}
	c := p.card("inert_js")
	if c.Provider != hostile["provider"]+" · "+hostile["model"] || c.Link != "" {
		p.fatalf("card %+v: want the provider and model as text, and no link", c)
	}
	if f := p.card("inert_failed"); !strings.Contains(f.Outcome, `<img src=y onerror="window.__pwned='error'">`) {
		p.fatalf("failed card %+v: want its error shown as text", f)
	}
	pr.check(p, "with hostile snapshots")
}
