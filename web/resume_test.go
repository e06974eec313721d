package web_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/chromedp/chromedp"

	"github.com/pushd/pushd/fanout"
	"github.com/pushd/pushd/internal/testenv"
	"github.com/pushd/pushd/node"
	"github.com/pushd/pushd/snapshot"
)

// TestClientResumesFromTheSync: from a node with streams, the SSE client
// keeps the cursor of the sync that completes a resumed connection's
// initial state, not only its last task's, and tells the page with a sync
// event. Here another task of the tenant moves 300 times before the first
// resume and 800 times after it: the second resume replays the 800 from
// the sync's cursor, where from the watched task's cursor it would be
// 1,100 entries behind, past the 1,000 a node replays, and read everything
// again.
func TestClientResumesFromTheSync(t *testing.T) {
	redis := testenv.SharedRedis(t)
	n := startNode(t, node.Config{RedisURL: redis.URL, KeyPrefix: redis.Names.Prefix, JWTSecret: testSecret, Streams: true})
	pub := fanout.NewRedisPublisher(redis.Client, redis.Names, fanout.WithStream(10000))
	tenant := testenv.UniqueID("t")
	watched, other := testenv.UniqueID("task"), testenv.UniqueID("task")
	version := map[string]int64{}
	entries := 0.0 // stream entries written, all of them the tenant's
	publish := func(id string, times int) {
		t.Helper()
		for range times {
			version[id]++
			s, err := snapshot.Parse(fmt.Appendf(nil, `{"task_id":%q,"tenant_id":%q,"project_id":"p1","user_id":"u1","status":"RUNNING","version":%d,"updated_at":1710000000000}`, id, tenant, version[id]))
			if err != nil {
				t.Fatal(err)
			}
			if _, err := pub.Publish(context.Background(), s); err != nil {
				t.Fatal(err)
			}
			entries++
		}
		// The sync's cursor is the node's position in the stream: the
		// node has read every entry before the test reconnects.
		base := testenv.Scrape(t, n.AdminURL)["pushd_stream_entries_total"] - entries
		testenv.Eventually(t, "the node read the stream", func() bool {
			return testenv.Scrape(t, n.AdminURL)["pushd_stream_entries_total"]-base >= entries
		})
	}
	publish(watched, 1)

	p := newBrowser(t).tab(t)
	p.do("navigate", chromedp.Navigate(n.URL+"/healthz")) // any page of the origin
	eval[bool](p, fmt.Sprintf(`import('/client/pushd.js').then((m) => {
		window.__tasks = 0;
		window.__syncs = 0;
		const c = new m.PushdClient({ token: %q, tasks: [%q], transport: 'sse' });
		c.addEventListener('task', () => window.__tasks++);
		c.addEventListener('sync', (e) => { if (e.detail.cursor) window.__syncs++; });
		window.__client = c;
		c.start();
		return true;
	})`, signedToken(t, tenant, "u1"), watched))
	p.wait("the watched task", `window.__tasks === 1`)

	// served counts the reconnects the node took a cursor from: replayed,
	// or fallen back to reading everything.
	served := func(m map[string]float64) (resumes, fallbacks float64) {
		for k, v := range m {
			if strings.HasPrefix(k, "pushd_resume_fallbacks_total") {
				fallbacks += v
			}
		}
		return m["pushd_resumes_total"], fallbacks
	}
	reconnect := func() (resumes, fallbacks float64) {
		t.Helper()
		r0, f0 := served(testenv.Scrape(t, n.AdminURL))
		eval[bool](p, `(window.__syncs = 0, window.__client.interrupt(), true)`)
		testenv.Eventually(t, "the node served the reconnect", func() bool {
			r, f := served(testenv.Scrape(t, n.AdminURL))
			resumes, fallbacks = r-r0, f-f0
			return resumes+fallbacks > 0
		})
		return resumes, fallbacks
	}

	publish(other, 300)
	if resumes, fallbacks := reconnect(); resumes != 1 || fallbacks != 0 {
		p.fatalf("the first reconnect: %v replayed, %v fell back; want it replayed", resumes, fallbacks)
	}
	p.wait("the resumed connection's sync", `window.__syncs > 0`)
	publish(other, 800)
	if resumes, fallbacks := reconnect(); resumes != 1 || fallbacks != 0 {
		p.fatalf("the second reconnect: %v replayed, %v fell back; want it replayed from the sync's cursor, 800 entries back", resumes, fallbacks)
	}
	if got := eval[int](p, `window.__client.stats.received`); got != 1 {
		p.fatalf("the client received %d snapshots, want the watched task's one: a resume sent it again", got)
	}
}

// TestManyTasksResumeWithSmallIDs: the SSE client asks for ids that name
// their own task only (cursor=own) and resumes with the versions it
// holds. Watching 40 tasks, more than a node's cursor names, every id the
// page sees is its own task's pair, and a reconnect is sent nothing but
// the task that moved since: a cursor of the node's own would have named
// only its last task, and the other 39 would have come again.
func TestManyTasksResumeWithSmallIDs(t *testing.T) {
	n := startNode(t, node.Config{JWTSecret: testSecret})
	var tasks []string
	for i := range 40 {
		id := fmt.Sprintf("%s_%02d", testenv.UniqueID("many"), i)
		publishTask(t, n.URL, id, 1)
		tasks = append(tasks, id)
	}
	// A task that does not exist: its refusal comes once a connection's
	// initial reads are done.
	missing := testenv.UniqueID("missing")
	p := newBrowser(t).tab(t)
	p.do("navigate", chromedp.Navigate(n.URL+"/healthz"))
	eval[bool](p, fmt.Sprintf(`import('/client/pushd.js').then((m) => {
		// An EventSource that records the id of every event it dispatches
		// (once, whatever the listeners).
		window.__ids = [];
		const seen = new WeakSet();
		class Recording extends EventSource {
			addEventListener(type, f, o) {
				super.addEventListener(type, (e) => {
					if ((type === 'task' || type === 'patch') && !seen.has(e)) {
						seen.add(e);
						window.__ids.push(e.lastEventId);
					}
					f(e);
				}, o);
			}
		}
		window.__tasks = [];
		window.__refusals = 0;
		const c = new m.PushdClient({ token: %q, tasks: %s, transport: 'sse', EventSource: Recording });
		c.addEventListener('task', (e) => window.__tasks.push(e.detail.task.task_id + '=' + e.detail.task.version));
		c.addEventListener('error', (e) => { if (e.detail.code === 'not_found') window.__refusals++; });
		window.__client = c;
		c.start();
		return true;
	})`, signedToken(t, "t1", "u1"), "['"+strings.Join(append(tasks, missing), "','")+"']"))
	p.wait("40 tasks and the refusal", `window.__tasks.length === 40 && window.__refusals === 1`)

	before := n.Hub().Stats().Delivered
	eval[bool](p, `(window.__client.interrupt(), true)`)
	p.wait("the resumed connection's initial reads", `window.__refusals === 2`)
	// The interrupted connection ends on the node when its socket's close
	// is read: until then it would be written the change too.
	testenv.Eventually(t, "the interrupted connection gone", func() bool { return n.Hub().Len() == 1 })
	// Anything the resume queued is written before a change queued after.
	publishTask(t, n.URL, tasks[7], 2)
	p.wait("the moved task", fmt.Sprintf(`window.__tasks.includes(%q)`, tasks[7]+"=2"))
	// A write is counted once its write(2) returned, which the page may
	// beat; what the resume wrote, before it, is counted by then too.
	delivered := func() int64 { return n.Hub().Stats().Delivered - before }
	testenv.Eventually(t, "the moved task's write counted", func() bool { return delivered() >= 1 })
	if got := delivered(); got != 1 {
		t.Fatalf("%d tasks written after the reconnect, want the one that moved", got)
	}
	ids := eval[[]string](p, `window.__ids`)
	shown := eval[[]string](p, `window.__tasks`)
	if len(ids) != len(shown) || len(shown) != 41 {
		t.Fatalf("%d ids for %d tasks shown, want 41 of each", len(ids), len(shown))
	}
	for i, id := range ids {
		if id != shown[i] {
			t.Fatalf("the event of %s carried the id %q, want its own pair", shown[i], id)
		}
	}
}
