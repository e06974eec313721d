package web_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/pushd/pushd/fanout"
	"github.com/pushd/pushd/hub"
	"github.com/pushd/pushd/internal/testenv"
	"github.com/pushd/pushd/node"
	"github.com/pushd/pushd/snapshot"
)

// TestClientAsksAgainForIDsRefusedRateLimited: a node whose read budget
// lets a user's subscriptions read two tasks at once refuses the rest of
// six with rate_limit_exceeded, saying when to come back in seconds and
// milliseconds that agree; the client tells the page so in the platform's
// words, asks for them again after retry_after_ms (a subscribe of those
// ids on WebSocket, a reconnect with its cursor on SSE) and ends up
// holding all six.
func TestClientAsksAgainForIDsRefusedRateLimited(t *testing.T) {
	redis := testenv.SharedRedis(t)
	n := startNode(t, node.Config{RedisURL: redis.URL, KeyPrefix: redis.Names.Prefix, JWTSecret: testSecret,
		Hub: hub.Config{SubscribeReads: 2, SubscribeReadBurst: 2}})
	pub := fanout.NewRedisPublisher(redis.Client, redis.Names)
	b := newBrowser(t)
	for _, transport := range transports {
		t.Run(transport, func(t *testing.T) {
			user := testenv.UniqueID("user")
			ids := make([]string, 6)
			for i := range ids {
				ids[i] = testenv.UniqueID("task")
				s, err := snapshot.Parse(fmt.Appendf(nil, `{"task_id":%q,"tenant_id":"t1","project_id":"p1","user_id":%q,"status":"RUNNING","version":1,"updated_at":1710000000000}`, ids[i], user))
				if err != nil {
					t.Fatal(err)
				}
				if _, err := pub.Publish(context.Background(), s); err != nil {
					t.Fatal(err)
				}
			}
			p := b.tab(t)
			p.do("navigate", chromedp.Navigate(n.URL+"/healthz")) // any page of the origin
			eval[bool](p, fmt.Sprintf(`import('/client/pushd.js').then((m) => {
				window.__held = new Set();
				window.__limited = 0;
				window.__bad = [];
				window.__announced = [];
				const agree = (s, ms) => Number.isInteger(s) && ms > 0 && s * 1000 >= ms && ms > (s - 1) * 1000;
				const c = new m.PushdClient({ token: %q, tasks: %s, transport: %q });
				c.addEventListener('task', (e) => window.__held.add(e.detail.task.task_id));
				c.addEventListener('error', (e) => {
					const d = e.detail;
					if (d.code !== 'rate_limit_exceeded') return;
					window.__limited++;
					if (!d.task_id || !agree(d.retry_after, d.retry_after_ms)) window.__bad.push(d);
				});
				c.addEventListener('limited', (e) => {
					const d = e.detail;
					window.__announced.push(d);
					if (d.source !== 'subscribe' || !agree(d.retryAfter, d.retryAfterMs) ||
						d.message !== 'too many requests, try again in ' + d.retryAfter + ' s') window.__bad.push(d);
				});
				c.start();
				return true;
			})`, signedToken(t, "t1", user), `["`+strings.Join(ids, `","`)+`"]`, transport))
			p.wait("every task held", `window.__held && window.__held.size === 6`)
			if limited := eval[int](p, `window.__limited`); limited == 0 {
				p.fatalf("no id was refused rate_limit_exceeded: the budget did not bite, so the test proves nothing")
			}
			if bad := eval[[]map[string]any](p, `window.__bad`); len(bad) > 0 {
				p.fatalf("refusals without a wait in seconds and milliseconds that agree, or without the platform's message: %v", bad)
			}
			if n := eval[int](p, `window.__announced.length`); n == 0 {
				p.fatalf("ids were refused, but the client announced no limited event")
			}
		})
	}
}

// A start the simulator refuses (429: twelve of the tenant's tasks are
// running) is shown on the page in the platform's words, with the 429's
// seconds.
func TestPageShowsTheLimitWhenStartIsRefused(t *testing.T) {
	n := startNode(t, node.Config{}, node.ForTest(node.TestTuning{DemoStep: time.Hour})) // the tasks started keep running
	tenant := testenv.UniqueID("full")
	token := demoToken(t, n.URL, tenant, "demo-user")
	for range 12 {
		startDemoTask(t, n.URL, token, "launch-campaign")
	}
	p := newBrowser(t).tab(t)
	p.open(n.URL, "tenant="+tenant)
	p.do("click start-t2v", chromedp.Click(chromedp.ID("start-t2v")))
	p.wait("the notice", `!document.getElementById('notice').hidden`)
	const want = "Could not start the task: too many requests, try again in 2 s"
	if got := eval[string](p, `document.getElementById('notice').textContent`); got != want {
		p.fatalf("notice %q, want %q", got, want)
	}
}
