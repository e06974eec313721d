package web_test

import (
	"fmt"
	"reflect"
	"testing"

	"github.com/chromedp/chromedp"

	"github.com/pushd/pushd/internal/testenv"
	"github.com/pushd/pushd/node"
)

// deltaDocs are a task's versions from queued to finished: progress ticks
// (a field or two of a document of several hundred bytes), then the task
// done with an output (a status, assets, a field gone, an object new).
func deltaDocs(task string) []string {
	docs := []string{fmt.Sprintf(`{"task_id":%q,"tenant_id":"t1","project_id":"p1","user_id":"u1","status":"QUEUED","progress":0,"stage":"queued","provider":"veo","model":"veo-3","queue_position":3,"preview_asset_id":null,"output_asset_id":null,"error_code":null,"version":1,"updated_at":1710000000000}`, task)}
	for v := 2; v <= 5; v++ {
		docs = append(docs, fmt.Sprintf(`{"task_id":%q,"tenant_id":"t1","project_id":"p1","user_id":"u1","status":"RUNNING","progress":%d,"stage":"provider_generating","provider":"veo","model":"veo-3","queue_position":null,"preview_asset_id":null,"output_asset_id":null,"error_code":null,"version":%d,"updated_at":%d}`, task, 20*v, v, 1710000000000+500*v))
	}
	return append(docs, fmt.Sprintf(`{"task_id":%q,"tenant_id":"t1","project_id":"p1","user_id":"u1","status":"SUCCEEDED","progress":100,"provider":"veo","model":"veo-3","queue_position":null,"preview_asset_id":"asset_p","output_asset_id":"asset_o","error_code":null,"version":6,"updated_at":1710000003000,"output":{"url":"https://cdn.example/o.mp4","seconds":8}}`, task))
}

// checkShown checks that the page's client was shown exactly docs, whole,
// in order.
func checkShown(t *testing.T, p *page, docs []string) {
	t.Helper()
	shown := eval[[]string](p, `window.__tasks.map((t) => JSON.stringify(t))`)
	if len(shown) != len(docs) {
		p.fatalf("shown %d versions, want %d: %v", len(shown), len(docs), shown)
	}
	for i := range docs {
		if got, want := testenv.DecodeJSON(t, []byte(shown[i])), testenv.DecodeJSON(t, []byte(docs[i])); !reflect.DeepEqual(got, want) {
			p.fatalf("version %d shown as %s, want %s", i+1, shown[i], docs[i])
		}
	}
}

// startDeltaPage starts a node, publishes the first of a task's
// deltaDocs and opens a page of the node's origin whose client, with more
// options, watches the task.
func startDeltaPage(t *testing.T, b *browser, transport, options string) (*testNode, *page, []string) {
	t.Helper()
	n := startNode(t, node.Config{JWTSecret: testSecret})
	task := testenv.UniqueID("delta")
	docs := deltaDocs(task)
	publishDoc(t, n.URL, docs[0])
	p := b.tab(t)
	p.do("navigate", chromedp.Navigate(n.URL+"/healthz"))
	startClient(p, fmt.Sprintf(`{ token: %q, transport: %q, tasks: [%q], %s }`, signedToken(t, "t1", "u1"), transport, task, options))
	return n, p, docs
}

// A page's client asks for deltas unless told not to: either way, each
// version it shows is exactly the document published, though with deltas
// the node wrote versions 3 to 6 as patches. (Version 2 goes whole: its
// queue_position becomes null, which a merge patch would read as a
// removal.)
func TestDeltasShownExactlyAsPublished(t *testing.T) {
	b := newBrowser(t)
	for _, transport := range transports {
		for _, deltas := range []string{"", "deltas: false"} {
			t.Run(fmt.Sprintf("%s/%q", transport, deltas), func(t *testing.T) {
				n, p, docs := startDeltaPage(t, b, transport, deltas)
				for i := range docs {
					if i > 0 {
						publishDoc(t, n.URL, docs[i])
					}
					p.wait(fmt.Sprintf("version %d", i+1), fmt.Sprintf(`window.__tasks.some((t) => t.version === %d)`, i+1))
				}
				checkShown(t, p, docs)
				want := int64(len(docs) - 2)
				if deltas != "" {
					want = 0
				}
				// A patch is counted once its write(2) returned, which the
				// page may beat.
				testenv.Eventually(t, "the patches counted", func() bool { return n.Hub().Stats().Patches >= want })
				if got := n.Hub().Stats().Patches; got != want {
					t.Fatalf("the node wrote %d patches, want %d", got, want)
				}
			})
		}
	}
}

// The page holds a version the connection never sent it (its own read got
// ahead): the next patch, from the version the connection sent, is not
// applied to it; the client reads the task whole, and shows the version
// the patch made, exactly.
func TestDeltasFromAVersionNotHeldReadWhole(t *testing.T) {
	b := newBrowser(t)
	for _, transport := range transports {
		t.Run(transport, func(t *testing.T) {
			n, p, docs := startDeltaPage(t, b, transport, "")
			p.wait("version 1", `window.__tasks.length === 1`)
			publishDoc(t, n.URL, docs[1])
			p.wait("version 2", `window.__tasks.length === 2`)
			// Version 3 reaches the page by another way only.
			eval[bool](p, fmt.Sprintf(`(window.__client.offer(%s), true)`, docs[2]))
			publishDoc(t, n.URL, docs[3])
			p.wait("version 4", `window.__tasks.some((t) => t.version === 4)`)
			checkShown(t, p, docs[:4])
			if got := eval[int](p, `window.__client.stats.wholeReads`); got != 1 {
				p.fatalf("%d whole reads, want 1", got)
			}
			testenv.Eventually(t, "the patch counted", func() bool { return n.Hub().Stats().Patches >= 1 })
			if got := n.Hub().Stats().Patches; got != 1 {
				t.Fatalf("the node wrote %d patches, want 1: v4 from v2 (v2 goes whole)", got)
			}
		})
	}
}
