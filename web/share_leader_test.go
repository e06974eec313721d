package web_test

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/pushd/pushd/auth"
	"github.com/pushd/pushd/hub"
	"github.com/pushd/pushd/internal/testenv"
	"github.com/pushd/pushd/node"
	"github.com/pushd/pushd/snapshot"
)

// What happens to the shared connection reaches every tab, as it would
// reach a client of each tab's own: the node switching to polling and
// back (mode events and serverMode, the tasks moving meanwhile), a task
// refused to one tab (its error event, to that tab only), and refusals
// for the user's read budget (a limited event in every tab, each tab
// still ending with its own tasks).
func TestShareRelaysWhatHappensToTheConnection(t *testing.T) {
	redis := testenv.SharedRedis(t)
	b := newBrowser(t)
	for _, transport := range transports {
		t.Run(transport, func(t *testing.T) {
			// A read budget of two tasks at once for the user's
			// subscriptions: the union of three tabs' tasks goes over it.
			n := startNode(t, node.Config{RedisURL: redis.URL, KeyPrefix: redis.Names.Prefix, JWTSecret: testSecret,
				Hub: hub.Config{PollInterval: 200 * time.Millisecond, SubscribeReads: 2, SubscribeReadBurst: 2}})
			tabs := startThreeTabs(t, b, n, transport, true)
			waitConns(t, n, 1)
			for _, tab := range tabs {
				eval[bool](tab.page, `(() => {
					window.__modes = []; window.__errors = []; window.__limited = [];
					window.__client.addEventListener('mode', (e) => window.__modes.push(e.detail.mode));
					window.__client.addEventListener('error', (e) => window.__errors.push(e.detail));
					window.__client.addEventListener('limited', (e) => window.__limited.push(e.detail));
					return true;
				})()`)
			}

			n.Hub().Lost(errors.New("test: bus lost"))
			for _, tab := range tabs {
				tab.wait("the server polls", `window.__client.serverMode === 'polling' && window.__modes.includes('polling')`)
				publishTask(t, n.URL, tab.task, 2)
			}
			for _, tab := range tabs {
				tab.waitVersion(tab.task, 2)
			}
			n.Hub().Restored()
			for _, tab := range tabs {
				tab.wait("the server pushes again", `window.__client.serverMode === 'push' && window.__modes.includes('push')`)
			}

			// Another tenant's task, asked for by one tab: refused to it
			// alone.
			foreign := testenv.UniqueID("foreign")
			publishDoc(t, n.URL, fmt.Sprintf(`{"task_id":%q,"tenant_id":"t2","status":"RUNNING","version":1}`, foreign))
			eval[bool](tabs[1].page, fmt.Sprintf(`(window.__client.subscribe({ tasks: [%q] }), true)`, foreign))
			tabs[1].wait("the refusal", fmt.Sprintf(`window.__errors.some((e) => e.task_id === %q)`, foreign))

			// Three more tasks in each tab, nine in all: the read budget
			// refuses some, every tab hears of it, and each ends with its
			// own four.
			more := make([][]string, len(tabs))
			for i, tab := range tabs {
				for range 3 {
					id := testenv.UniqueID(fmt.Sprintf("more%d", i))
					publishTask(t, n.URL, id, 1)
					more[i] = append(more[i], id)
				}
				eval[bool](tab.page, fmt.Sprintf(`(window.__client.subscribe({ tasks: ["%s"] }), true)`, strings.Join(more[i], `","`)))
			}
			for i, tab := range tabs {
				for _, id := range more[i] {
					tab.waitVersion(id, 1)
				}
				tab.wait("a limited event", `window.__limited.length > 0`)
				shown := eval[[]string](tab.page, `[...new Set(window.__seen.map((s) => s.id))]`)
				slices.Sort(shown)
				want := append([]string{tab.task}, more[i]...)
				slices.Sort(want)
				if !slices.Equal(shown, want) {
					tab.fatalf("tab %d was shown %v, want its own %v", i, shown, want)
				}
				if i != 1 {
					if errs := eval[int](tab.page, fmt.Sprintf(`window.__errors.filter((e) => e.task_id === %q).length`, foreign)); errs > 0 {
						tab.fatalf("tab %d was told of a refusal of a task it never asked for", i)
					}
				}
			}
			for _, tab := range tabs {
				tab.close()
			}
			waitConns(t, n, 0)
		})
	}
}

// The leader refreshes its token on the open WebSocket before the token's
// exp, with its own token function: the shared connection outlives the
// first token, and the following tab, which never sends a token, keeps
// receiving over it without a reconnect.
func TestShareLeaderRefreshesTheToken(t *testing.T) {
	n := startNode(t, node.Config{JWTSecret: testSecret, Demo: true})
	b := newBrowser(t)
	sign := func(exp time.Time) string {
		grant, _ := snapshot.ParseGrant([]string{"p1"})
		tok, err := auth.NewSigner(testSecret).Sign(auth.Principal{TenantID: "share-refresh", UserID: "u1", ExpiresAt: exp, Grant: grant})
		if err != nil {
			t.Fatal(err)
		}
		return tok
	}
	// One expiry for both tabs' first tokens: whichever leads, it must
	// refresh before then.
	expires := time.Now().Add(4 * time.Second).Truncate(time.Second)
	tabs := sameContextTabs(t, b, 2)
	for _, p := range tabs {
		short, long := sign(expires), sign(time.Now().Add(time.Hour))
		p.do("navigate", chromedp.Navigate(n.URL+"/healthz"))
		// The short token twice: the tab reads its identity from the
		// first, the connection it may lead is made with the second.
		startClient(p, fmt.Sprintf(`{ token: (() => { const tokens = [%q, %q, %q]; let calls = 0; return async () => tokens[Math.min(calls++, 2)]; })(), transport: 'ws', projects: ['p1'], share: true }`, short, short, long))
	}
	for _, p := range tabs {
		p.wait("streaming, shared by two tabs", `window.__client.state === 'streaming' && window.__client.shared.tabs === 2`)
	}
	waitConns(t, n, 1)
	tabs[0].wait("the first tokens' exp passed", fmt.Sprintf(`Date.now() > %d`, expires.Add(1500*time.Millisecond).UnixMilli()))
	started := startDemoTask(t, n.URL, sign(time.Now().Add(time.Hour)), "p1")
	for _, p := range tabs {
		p.wait("a task over the refreshed connection", fmt.Sprintf(`window.__tasks.some((t) => t.task_id === %q)`, started))
		if got := eval[[]string](p, `window.__states.map((s) => s.state)`); slices.Contains(got, "closed") || strings.Count(strings.Join(got, " "), "connecting") > 1 {
			p.fatalf("states %v: the shared connection was left and made again", got)
		}
	}
	if st := n.Hub().Stats(); st.Refreshes != 1 || st.Cuts[hub.CutTokenExpired] != 0 || st.Conns != 1 {
		t.Fatalf("%d refreshes, %d connections closed at exp, %d open: want 1, 0 and the one shared", st.Refreshes, st.Cuts[hub.CutTokenExpired], st.Conns)
	}
	for _, p := range tabs {
		p.close()
	}
	waitConns(t, n, 0)
}

// The leader's stream endpoint fails and its client falls back to polling
// over HTTP: every tab is told it polls, each is shown its own task's
// versions as the polls read them, and none another's; when the stream is
// back, every tab streams again over one connection.
func TestShareLeaderPollingReachesEveryTab(t *testing.T) {
	b := newBrowser(t)
	for _, transport := range transports {
		t.Run(transport, func(t *testing.T) {
			n := startNode(t, node.Config{JWTSecret: testSecret})
			br := &breaker{next: n.Handler(), done: make(chan struct{})}
			base := serve(t, br)
			t.Cleanup(func() { close(br.done) }) // before serve's cleanup, which waits for handlers
			tabs := startThreeTabsAt(t, b, n, base, transport, "share: true, fallbackAfter: 2, pollIntervalMs: 250, streamRetryMs: 1500")
			for _, tab := range tabs {
				tab.wait("shared by three tabs", `window.__client.shared.tabs === 3`)
			}
			waitConns(t, n, 1)
			leader := leaderOf(t, tabs, -1)

			br.mode.Store(break502)
			eval[bool](tabs[leader].page, `(window.__client.interrupt(), true)`)
			for _, tab := range tabs {
				tab.wait("polling", `window.__client.state === 'polling'`)
			}
			waitConns(t, n, 0)
			publishEach(t, n, tabs, 2, 3)
			for i, tab := range tabs {
				tab.checkOwn(tab.task, 1, 2, 3)
				for v := 2; v <= 3; v++ {
					how := eval[string](tab.page, fmt.Sprintf(`(({ source, state }) => source + ' ' + state)(window.__seen.find((s) => s.id === %q && s.v === %d))`, tab.task, v))
					if how != "poll polling" {
						tab.fatalf("tab %d was shown version %d by %q, want a poll while polling", i, v, how)
					}
				}
				// The counters of the shared connection, which a follower
				// learns from the leader.
				tab.wait("the leader's polls counted", `window.__client.stats.polls > 0 && window.__client.stats.fallbacks > 0`)
			}
			if got := leaderOf(t, tabs, -1); got != leader {
				t.Fatalf("tab %d leads while polling, want tab %d still", got, leader)
			}

			br.mode.Store(breakNone)
			for _, tab := range tabs {
				tab.wait("streaming again", `window.__client.state === 'streaming'`)
			}
			waitConns(t, n, 1)
			for _, tab := range tabs {
				publishTask(t, n.URL, tab.task, 4)
			}
			for _, tab := range tabs {
				tab.waitVersion(tab.task, 4)
				tab.checkOwn(tab.task, 1, 2, 3, 4)
			}
			for _, tab := range tabs {
				tab.close()
			}
			waitConns(t, n, 0)
		})
	}
}
