package web_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	cdppage "github.com/chromedp/cdproto/page"
	"github.com/chromedp/chromedp"

	"github.com/pushd/pushd/auth"
	"github.com/pushd/pushd/internal/testenv"
	"github.com/pushd/pushd/node"
	"github.com/pushd/pushd/snapshot"
)

// handover is the longest a shared connection may take to move to another
// tab when its leader closes or freezes: the protocol's promise, measured
// from the close or the freeze to the arrival of the next version.
const handover = 2 * time.Second

// sharedTab is a tab on the node's origin with a client of its own,
// window.__client, whose task events it records in window.__seen.
type sharedTab struct {
	*page
	task string // the task its client watches
}

// close closes the tab, as a person closing it would, and waits until it
// is gone.
func (p *page) close() {
	p.t.Helper()
	if err := chromedp.Cancel(p.ctx); err != nil {
		p.t.Fatalf("close the tab: %v", err)
	}
}

// sameContextTabs opens count tabs of one browser context, which share
// BroadcastChannel and Web Locks as the tabs of one browser profile do.
// The context belongs to a blank tab of its own, so that any of the
// tabs can be closed alone.
func sameContextTabs(t *testing.T, b *browser, count int) []*page {
	t.Helper()
	anchor := b.tab(t)
	var tabs []*page
	for range count {
		ctx, cancel := chromedp.NewContext(anchor.ctx)
		t.Cleanup(cancel)
		if err := chromedp.Do(ctx); err != nil { // creates the tab, without a timeout: one would close it
			t.Fatalf("new tab: %v", err)
		}
		tabs = append(tabs, &page{t: t, ctx: ctx})
	}
	return tabs
}

// startSharedAt loads a page of base's origin in p and starts a client
// there watching task, with more options. Each task event is recorded
// with its source and the client's state when it came.
func startSharedAt(p *page, base, token, transport, task, options string) {
	p.t.Helper()
	p.do("navigate", chromedp.Navigate(base+"/healthz"))
	eval[bool](p, fmt.Sprintf(`import('/client/pushd.js').then((m) => {
		const c = new m.PushdClient({ token: %q, transport: %q, tasks: [%q], backoffBaseMs: 100, %s });
		window.__seen = [];
		window.__states = [];
		c.addEventListener('task', (e) => window.__seen.push({ id: e.detail.task.task_id, v: e.detail.task.version, at: Date.now(), source: e.detail.source, state: c.state }));
		c.addEventListener('state', (e) => window.__states.push(e.detail.state));
		window.__client = c;
		c.start();
		return true;
	})`, token, transport, task, options))
}

// versions are the versions of task the tab's client announced, in order.
func (p *page) versions(task string) []int {
	p.t.Helper()
	return eval[[]int](p, fmt.Sprintf(`window.__seen.filter((s) => s.id === %q).map((s) => s.v)`, task))
}

// arrived is when (Unix ms, the page's clock) the tab's client announced
// version v of task.
func (p *page) arrived(task string, v int) int64 {
	p.t.Helper()
	return eval[int64](p, fmt.Sprintf(`window.__seen.find((s) => s.id === %q && s.v === %d)?.at ?? 0`, task, v))
}

func (p *page) waitVersion(task string, v int) {
	p.t.Helper()
	p.wait(fmt.Sprintf("%s v%d", task, v), fmt.Sprintf(`window.__seen?.some((s) => s.id === %q && s.v === %d)`, task, v))
}

func (p *page) role() string {
	p.t.Helper()
	return eval[string](p, `String(window.__client.shared.role)`)
}

// checkOwn checks that the tab was shown its own task only, each version
// once, in order, and the versions want.
func (p *page) checkOwn(task string, want ...int) {
	p.t.Helper()
	if others := eval[[]string](p, fmt.Sprintf(`window.__seen.filter((s) => s.id !== %q).map((s) => s.id + ' v' + s.v)`, task)); len(others) > 0 {
		p.fatalf("the tab watching %s was shown %v", task, others)
	}
	if got := p.versions(task); !slices.Equal(got, want) {
		p.fatalf("the tab was shown %s at versions %v, want %v", task, got, want)
	}
}

// startThreeTabs starts three tabs of one browser context, each watching
// a task of its own at version 1, and waits until each has it.
func startThreeTabs(t *testing.T, b *browser, n *testNode, transport string, share bool) []*sharedTab {
	t.Helper()
	return startThreeTabsAt(t, b, n, n.URL, transport, fmt.Sprintf("share: %v", share))
}

// startThreeTabsAt is startThreeTabs on pages of base's origin (n's, or a
// proxy's in front of it), their clients with more options.
func startThreeTabsAt(t *testing.T, b *browser, n *testNode, base, transport, options string) []*sharedTab {
	t.Helper()
	tok := signedToken(t, "t1", "u1")
	var tabs []*sharedTab
	for i, p := range sameContextTabs(t, b, 3) {
		task := testenv.UniqueID(fmt.Sprintf("share%d", i))
		publishTask(t, n.URL, task, 1)
		startSharedAt(p, base, tok, transport, task, options)
		tabs = append(tabs, &sharedTab{page: p, task: task})
	}
	for _, tab := range tabs {
		tab.waitVersion(tab.task, 1)
		tab.wait("streaming", `window.__client.state === 'streaming'`)
	}
	return tabs
}

// publishEach publishes each version of versions to every tab's task, and
// waits until every tab has it before the next.
func publishEach(t *testing.T, n *testNode, tabs []*sharedTab, versions ...int) {
	t.Helper()
	for _, v := range versions {
		for _, tab := range tabs {
			publishTask(t, n.URL, tab.task, v)
		}
		for _, tab := range tabs {
			tab.waitVersion(tab.task, v)
		}
	}
}

// waitConns waits until the node counts want open connections.
func waitConns(t *testing.T, n *testNode, want int) {
	t.Helper()
	testenv.EventuallyWithin(t, fmt.Sprintf("%d connections open on the node", want), waitFor, func() bool {
		return n.Hub().Stats().Conns == want
	})
}

// leaderOf is the index of the one tab of tabs that leads, skipping skip;
// it fails the test unless exactly one does and the others follow.
func leaderOf(t *testing.T, tabs []*sharedTab, skip int) int {
	t.Helper()
	leader := -1
	var roles []string
	for i, tab := range tabs {
		if i == skip {
			continue
		}
		r := tab.role()
		roles = append(roles, r)
		switch {
		case r == "leader" && leader < 0:
			leader = i
		case r == "leader", r != "follower":
			t.Fatalf("roles %v, want one leader and followers", roles)
		}
	}
	if leader < 0 {
		t.Fatalf("roles %v: no leader", roles)
	}
	return leader
}

// Three tabs of one browser, each watching its own task, hold one
// connection: one leads, the others follow, and each is shown its own
// task's versions and nothing else.
func TestShareThreeTabsHoldOneConnection(t *testing.T) {
	b := newBrowser(t)
	for _, transport := range transports {
		t.Run(transport, func(t *testing.T) {
			n := startNode(t, node.Config{JWTSecret: testSecret})
			tabs := startThreeTabs(t, b, n, transport, true)
			waitConns(t, n, 1)
			leaderOf(t, tabs, -1)
			for _, tab := range tabs {
				tab.wait("three tabs", `window.__client.shared.tabs === 3`)
			}
			publishEach(t, n, tabs, 2, 3)
			for _, tab := range tabs {
				tab.checkOwn(tab.task, 1, 2, 3)
			}
			if got := n.Hub().Stats().Conns; got != 1 {
				t.Fatalf("%d connections, want 1", got)
			}

			// A follower's close ends its own subscription only: the
			// shared connection stops watching its task, and the other
			// tabs go on.
			gone := (leaderOf(t, tabs, -1) + 1) % len(tabs)
			eval[bool](tabs[gone].page, `(window.__client.close(), true)`)
			testenv.EventuallyWithin(t, "the closed tab's task unwatched", waitFor, func() bool {
				return watchers(t, n, tabs[gone].task) == 0
			})
			for i, tab := range tabs {
				publishTask(t, n.URL, tab.task, 4)
				if i != gone {
					tab.waitVersion(tab.task, 4)
					tab.checkOwn(tab.task, 1, 2, 3, 4)
				}
			}
			if got := n.Hub().Stats().Conns; got != 1 {
				t.Fatalf("%d connections after a follower closed, want 1", got)
			}
			for _, tab := range tabs {
				tab.close()
			}
			waitConns(t, n, 0)
		})
	}
}

// watchers is how many connections the node's inspector names as
// watching task.
func watchers(t *testing.T, n *testNode, task string) int {
	t.Helper()
	resp, err := http.Get(n.AdminURL + "/inspect/tasks/" + task)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var seen struct{ Watchers []json.RawMessage }
	if err := json.NewDecoder(resp.Body).Decode(&seen); err != nil {
		t.Fatal(err)
	}
	return len(seen.Watchers)
}

// The leader's tab closes: another tab leads within the handover time,
// resuming, and the others are shown every version once, in order.
func TestShareHandoverWhenTheLeaderCloses(t *testing.T) {
	b := newBrowser(t)
	for _, transport := range transports {
		t.Run(transport, func(t *testing.T) {
			n := startNode(t, node.Config{JWTSecret: testSecret})
			tabs := startThreeTabs(t, b, n, transport, true)
			waitConns(t, n, 1)
			gone := leaderOf(t, tabs, -1)

			closed := time.Now()
			tabs[gone].close()
			for i, tab := range tabs {
				if i != gone {
					publishTask(t, n.URL, tab.task, 2)
				}
			}
			for i, tab := range tabs {
				if i == gone {
					continue
				}
				tab.waitVersion(tab.task, 2)
				took := time.Duration(tab.arrived(tab.task, 2)-closed.UnixMilli()) * time.Millisecond
				t.Logf("%s: version 2 in tab %d %v after the leader closed", transport, i, took)
				if took > handover {
					t.Errorf("tab %d got version 2 %v after the leader closed, want within %v", i, took, handover)
				}
			}
			leaderOf(t, tabs, gone)
			for i, tab := range tabs {
				if i != gone {
					tab.wait("two tabs", `window.__client.shared.tabs === 2`)
					publishTask(t, n.URL, tab.task, 3)
				}
			}
			for i, tab := range tabs {
				if i != gone {
					tab.waitVersion(tab.task, 3)
					tab.checkOwn(tab.task, 1, 2, 3)
				}
			}
			waitConns(t, n, 1)
			for i, tab := range tabs {
				if i != gone {
					tab.close()
				}
			}
			waitConns(t, n, 0)
		})
	}
}

// The leader's tab is frozen, as a browser freezes a background tab:
// another tab leads within the handover time. Thawed, the frozen tab
// follows; one leader, one connection, and no tab is shown an older
// version after a newer one.
func TestShareHandoverWhenTheLeaderFreezes(t *testing.T) {
	b := newBrowser(t)
	for _, transport := range transports {
		t.Run(transport, func(t *testing.T) {
			n := startNode(t, node.Config{JWTSecret: testSecret})
			tabs := startThreeTabs(t, b, n, transport, true)
			waitConns(t, n, 1)
			frozen := leaderOf(t, tabs, -1)

			at := time.Now()
			lifecycle(t, tabs[frozen].page, cdppage.SetWebLifecycleStateStateFrozen)
			for _, tab := range tabs {
				publishTask(t, n.URL, tab.task, 2)
			}
			for i, tab := range tabs {
				if i == frozen {
					continue
				}
				tab.waitVersion(tab.task, 2)
				took := time.Duration(tab.arrived(tab.task, 2)-at.UnixMilli()) * time.Millisecond
				t.Logf("%s: version 2 in tab %d %v after the leader froze", transport, i, took)
				if took > handover {
					t.Errorf("tab %d got version 2 %v after the leader froze, want within %v", i, took, handover)
				}
			}
			leaderOf(t, tabs, frozen)

			lifecycle(t, tabs[frozen].page, cdppage.SetWebLifecycleStateStateActive)
			tabs[frozen].wait("the thawed tab follows", `window.__client.shared.role === 'follower'`)
			leaderOf(t, tabs, -1)
			waitConns(t, n, 1)
			for _, tab := range tabs {
				publishTask(t, n.URL, tab.task, 3)
			}
			for i, tab := range tabs {
				tab.waitVersion(tab.task, 3)
				if i == frozen {
					// It may have missed version 2 while frozen; never
					// an older one after a newer.
					got := tab.versions(tab.task)
					for j := 1; j < len(got); j++ {
						if got[j] <= got[j-1] {
							tab.fatalf("the thawed tab was shown %s at versions %v", tab.task, got)
						}
					}
					continue
				}
				tab.checkOwn(tab.task, 1, 2, 3)
			}
			for _, tab := range tabs {
				tab.close()
			}
			waitConns(t, n, 0)
		})
	}
}

func lifecycle(t *testing.T, p *page, state cdppage.SetWebLifecycleStateState) {
	t.Helper()
	ctx, cancel := context.WithTimeout(p.ctx, waitFor)
	defer cancel()
	if _, err := chromedp.Call(ctx, cdppage.SetWebLifecycleState, cdppage.SetWebLifecycleStateParams{State: state}); err != nil {
		t.Fatalf("set the tab %s: %v", state, err)
	}
}

// publishOf publishes version v of a task of user's, in a project of the
// user's own.
func publishOf(t *testing.T, base, user, task string, v int) {
	t.Helper()
	doc := fmt.Sprintf(`{"task_id":%q,"tenant_id":"t1","project_id":"p-%s","user_id":%q,"status":"RUNNING","progress":%d,"version":%d}`, task, user, user, 10*v, v)
	resp, err := http.Post(base+"/v1/publish", "application/json", strings.NewReader(doc))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(resp.Body)
		t.Fatalf("publish %s v%d: %d %s", task, v, resp.StatusCode, body)
	}
}

// Two users never share a connection, whether their tabs are in two
// browser profiles or in one: each tab leads its own, and is shown its
// user's task only, though the second asks for the first's task too.
func TestShareNeverAcrossUsers(t *testing.T) {
	b := newBrowser(t)
	for _, transport := range transports {
		for _, where := range []string{"two contexts", "one context"} {
			t.Run(transport+"/"+where, func(t *testing.T) {
				n := startNode(t, node.Config{JWTSecret: testSecret})
				var pages []*page
				if where == "two contexts" {
					pages = []*page{b.tab(t), b.tab(t)}
				} else {
					pages = sameContextTabs(t, b, 2)
				}
				users := []string{"u1", "u2"}
				tasks := []string{testenv.UniqueID("mine"), testenv.UniqueID("theirs")}
				for i, p := range pages {
					publishOf(t, n.URL, users[i], tasks[i], 1)
					p.do("navigate", chromedp.Navigate(n.URL+"/healthz"))
				}
				for i, p := range pages {
					watch := fmt.Sprintf("[%q]", tasks[i])
					if i == 1 {
						watch = fmt.Sprintf("[%q, %q]", tasks[1], tasks[0])
					}
					eval[bool](p, fmt.Sprintf(`import('/client/pushd.js').then((m) => {
						const c = new m.PushdClient({ token: %q, transport: %q, tasks: %s, share: true });
						window.__seen = [];
						c.addEventListener('task', (e) => window.__seen.push({ id: e.detail.task.task_id, v: e.detail.task.version, at: Date.now() }));
						window.__client = c;
						c.start();
						return true;
					})`, signedToken(t, "t1", users[i]), transport, watch))
				}
				for i, p := range pages {
					p.waitVersion(tasks[i], 1)
				}
				waitConns(t, n, 2)
				for i, p := range pages {
					p.wait("leads alone", `window.__client.shared.role === 'leader' && window.__client.shared.tabs === 1`)
					publishOf(t, n.URL, users[i], tasks[i], 2)
				}
				for i, p := range pages {
					p.waitVersion(tasks[i], 2)
					p.checkOwn(tasks[i], 1, 2)
				}
				for _, p := range pages {
					p.close()
				}
				waitConns(t, n, 0)
			})
		}
	}
}

// Without share, three tabs of one browser hold three connections, each
// its own task's.
func TestShareOffThreeConnections(t *testing.T) {
	b := newBrowser(t)
	for _, transport := range transports {
		t.Run(transport, func(t *testing.T) {
			n := startNode(t, node.Config{JWTSecret: testSecret})
			tabs := startThreeTabs(t, b, n, transport, false)
			waitConns(t, n, 3)
			for _, tab := range tabs {
				if r := tab.role(); r != "null" {
					tab.fatalf("role %s without share", r)
				}
				publishTask(t, n.URL, tab.task, 2)
			}
			for _, tab := range tabs {
				tab.waitVersion(tab.task, 2)
				tab.checkOwn(tab.task, 1, 2)
			}
			for _, tab := range tabs {
				tab.close()
			}
			waitConns(t, n, 0)
		})
	}
}

// Two demo tabs of one browser, of the same tenant, user and project, hold
// one connection: the panel of one says it leads, the other's that it
// follows, and a task started in the follower shows live in both.
func TestShareDemoTabsShowTheirRoles(t *testing.T) {
	n := startNode(t, node.Config{})
	b := newBrowser(t)
	for _, transport := range transports {
		t.Run(transport, func(t *testing.T) {
			tabs := sameContextTabs(t, b, 2)
			for _, p := range tabs {
				p.open(n.URL, "tenant=share-"+transport+"&transport="+transport)
			}
			waitConns(t, n, 1)
			roles := map[string]*page{}
			for _, p := range tabs {
				p.wait("two tabs sharing", `document.getElementById('conn').dataset.tabs === '2'`)
				roles[eval[string](p, `document.getElementById('conn').dataset.role`)] = p
			}
			leader, follower := roles["leader"], roles["follower"]
			if leader == nil || follower == nil {
				t.Fatalf("roles %v, want a leader and a follower", roles)
			}
			if got := eval[string](leader, `document.getElementById('f-role').textContent`); got != "Leads · 2 tabs" {
				leader.fatalf("the leader's panel says %q", got)
			}
			if got := eval[string](follower, `document.getElementById('f-role').textContent`); got != "Follows · 2 tabs" {
				follower.fatalf("the follower's panel says %q", got)
			}
			task := follower.start("text_to_video", false)
			follower.waitStatus(task, "SUCCEEDED")
			leader.waitStatus(task, "SUCCEEDED")
			checkWalkShown(t, follower, task)
			checkWalkShown(t, leader, task)
			if got := n.Hub().Stats().Conns; got != 1 {
				t.Fatalf("%d connections for two tabs, want 1", got)
			}
			// The inspector, as an operator reads it: one connection
			// watches the task both tabs show.
			if got := watchers(t, n, task); got != 1 {
				t.Fatalf("the inspector names %d watchers of %s, want the one shared connection", got, task)
			}
			for _, p := range tabs {
				p.close()
			}
			waitConns(t, n, 0)
		})
	}
}

// One connection serves three tabs watching by project, by user and by
// id, with a token that sees every project: each tab is shown what its
// own client would have been, and nothing of the others'.
func TestShareEachTabItsOwnScope(t *testing.T) {
	b := newBrowser(t)
	grant, err := snapshot.ParseGrant([]string{"*"})
	if err != nil {
		t.Fatal(err)
	}
	tok, err := auth.NewSigner(testSecret).Sign(auth.Principal{TenantID: "t1", UserID: "u1", ExpiresAt: time.Now().Add(time.Hour), Grant: grant})
	if err != nil {
		t.Fatal(err)
	}
	for _, transport := range transports {
		t.Run(transport, func(t *testing.T) {
			n := startNode(t, node.Config{JWTSecret: testSecret})
			// Each task, and the scope of the tab that alone must show it.
			byProject, byUser, byID, nobody := testenv.UniqueID("proj"), testenv.UniqueID("user"), testenv.UniqueID("id"), testenv.UniqueID("none")
			publish := func(task, project, user string, v int) {
				t.Helper()
				doc := fmt.Sprintf(`{"task_id":%q,"tenant_id":"t1","project_id":%q,"user_id":%q,"status":"RUNNING","version":%d}`, task, project, user, v)
				resp, err := http.Post(n.URL+"/v1/publish", "application/json", strings.NewReader(doc))
				if err != nil {
					t.Fatal(err)
				}
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					t.Fatalf("publish %s: %d", task, resp.StatusCode)
				}
			}
			scopes := []struct{ options, task string }{
				{`projects: ['pa']`, byProject},
				{`user: true`, byUser},
				{fmt.Sprintf(`tasks: [%q]`, byID), byID},
			}
			tabs := sameContextTabs(t, b, len(scopes))
			for i, p := range tabs {
				p.do("navigate", chromedp.Navigate(n.URL+"/healthz"))
				eval[bool](p, fmt.Sprintf(`import('/client/pushd.js').then((m) => {
					const c = new m.PushdClient({ token: %q, transport: %q, share: true, %s });
					window.__seen = [];
					c.addEventListener('task', (e) => window.__seen.push({ id: e.detail.task.task_id, v: e.detail.task.version, at: Date.now() }));
					window.__client = c;
					c.start();
					return true;
				})`, tok, transport, scopes[i].options))
				p.wait("sharing", fmt.Sprintf(`window.__client.state === 'streaming' && window.__client.shared.tabs === %d`, i+1))
			}
			waitConns(t, n, 1)
			for v := 1; v <= 2; v++ {
				publish(byProject, "pa", "u2", v) // another user's, in the project
				publish(byUser, "pb", "u1", v)    // the user's own, in another project
				publish(byID, "pc", "u2", v)      // another user's, by id
				publish(nobody, "pb", "u3", v)    // no tab's
				for i, p := range tabs {
					p.waitVersion(scopes[i].task, v)
				}
			}
			for i, p := range tabs {
				p.checkOwn(scopes[i].task, 1, 2)
			}
			for _, p := range tabs {
				p.close()
			}
			waitConns(t, n, 0)
		})
	}
}
