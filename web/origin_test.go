package web_test

import (
	"fmt"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"testing"

	"github.com/chromedp/chromedp"

	"github.com/pushd/pushd/internal/testenv"
	"github.com/pushd/pushd/node"
)

// originPage is the product page of another origin: it loads the client
// from the module URL given in its query (the npm package's file, served
// by the page's own origin as a bundler would ship it, or the node's
// /client/pushd.js), streams one task from the node over the transport
// given, and keeps what it saw in window.seen.
const originPage = `<!doctype html><meta charset="utf-8"><title>product</title>
<script type="module">
const q = new URLSearchParams(location.search);
const { PushdClient } = await import(q.get('module'));
window.seen = [];
window.client = new PushdClient({ url: q.get('node'), token: q.get('token'), transport: q.get('transport'), tasks: [q.get('task')] });
client.addEventListener('task', (e) => seen.push(e.detail.task.version));
client.addEventListener('hello', () => { window.streaming = true; });
client.start();
</script>`

// A page on its own origin works with nothing but --allowed-origins on
// the node: it loads the client (the npm package, or the node's
// /client/pushd.js across origins), streams over SSE and WebSocket, and
// reads a snapshot with fetch and its Authorization header. A node that
// does not list the origin refuses all three.
func TestPageOnAnotherOrigin(t *testing.T) {
	pkg := filepath.Join(scratchProject(t, packClient(t)), "node_modules", "@pushd", "client", "pushd.js")
	mux := http.NewServeMux()
	mux.HandleFunc("GET /index.html", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		fmt.Fprint(w, originPage)
	})
	mux.HandleFunc("GET /pushd.js", func(w http.ResponseWriter, r *http.Request) {
		b, err := os.ReadFile(pkg)
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "text/javascript")
		w.Write(b)
	})
	product := serve(t, mux) // http://127.0.0.1:<port>: an origin of its own

	cfg := node.Config{JWTSecret: testSecret}
	cfg.API.OriginPatterns = []string{product}
	n := startNode(t, cfg)
	tok := signedToken(t, "t1", "u1")
	b := newBrowser(t)
	for _, module := range []struct{ name, url string }{{"npm", product + "/pushd.js"}, {"node", n.URL + "/client/pushd.js"}} {
		for _, transport := range transports {
			t.Run(module.name+"/"+transport, func(t *testing.T) {
				task := testenv.UniqueID("origin")
				publishTask(t, n.URL, task, 1)
				p := b.tab(t)
				p.do("navigate", chromedp.Navigate(productURL(product, module.url, n.URL, tok, transport, task)))
				p.wait("version 1", `window.seen?.includes(1)`)
				publishTask(t, n.URL, task, 2)
				p.wait("version 2", `window.seen?.includes(2)`)
				read := eval[int](p, fmt.Sprintf(`fetch(%q, { headers: { Authorization: 'Bearer ' + %q } }).then((r) => r.json()).then((s) => s.version)`,
					n.URL+"/v1/tasks/"+task, tok))
				if read != 2 {
					t.Fatalf("the page read version %d of the snapshot, want 2", read)
				}
			})
		}
	}

	// A node that does not list the page's origin: the page can neither
	// stream nor read, though it loads the client.
	other := startNode(t, node.Config{JWTSecret: testSecret})
	task := testenv.UniqueID("origin")
	publishTask(t, other.URL, task, 1)
	for _, transport := range transports {
		p := b.tab(t)
		p.do("navigate", chromedp.Navigate(productURL(product, other.URL+"/client/pushd.js", other.URL, tok, transport, task)))
		p.wait("the client's reconnects", `window.client?.stats.reconnects >= 2`)
		if eval[bool](p, `window.streaming === true || window.seen.length > 0`) {
			t.Errorf("%s: a page of an unlisted origin streamed", transport)
		}
		refused := eval[bool](p, fmt.Sprintf(`fetch(%q, { headers: { Authorization: 'Bearer ' + %q } }).then(() => false, () => true)`,
			other.URL+"/v1/tasks/"+task, tok))
		if !refused {
			t.Errorf("%s: a page of an unlisted origin read a snapshot", transport)
		}
	}
}

// productURL is originPage's URL on the product's origin.
func productURL(product, module, node, token, transport, task string) string {
	q := url.Values{"module": {module}, "node": {node}, "token": {token}, "transport": {transport}, "task": {task}}
	return product + "/index.html?" + q.Encode()
}
