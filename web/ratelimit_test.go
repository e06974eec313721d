package web_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/chromedp/chromedp"

	"github.com/pushd/pushd/fanout"
	"github.com/pushd/pushd/internal/node"
	"github.com/pushd/pushd/internal/testenv"
	"github.com/pushd/pushd/snapshot"
)

// TestClientAsksAgainForIDsRefusedRateLimited: a node whose read budget
// lets a user's subscriptions read two tasks at once refuses the rest of
// six with rate_limited; the client asks for them again after
// retry_after_ms (a subscribe of those ids on WebSocket, a reconnect with
// its cursor on SSE) and ends up holding all six.
func TestClientAsksAgainForIDsRefusedRateLimited(t *testing.T) {
	redis := testenv.SharedRedis(t)
	n := startNode(t, node.Config{RedisURL: redis.URL, KeyPrefix: redis.Names.Prefix, JWTSecret: testSecret,
		SubscribeReads: 2, SubscribeReadBurst: 2})
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
				const c = new m.PushdClient({ token: %q, tasks: %s, transport: %q });
				c.addEventListener('task', (e) => window.__held.add(e.detail.task.task_id));
				c.addEventListener('error', (e) => { if (e.detail.code === 'rate_limited') window.__limited++; });
				c.start();
				return true;
			})`, signedToken(t, "t1", user), `["`+strings.Join(ids, `","`)+`"]`, transport))
			p.wait("every task held", `window.__held && window.__held.size === 6`)
			if limited := eval[int](p, `window.__limited`); limited == 0 {
				p.fatalf("no id was refused rate_limited: the budget did not bite, so the test proves nothing")
			}
		})
	}
}
