package web_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/chromedp/chromedp"

	"github.com/pushd/pushd/node"
)

// The packages the Node.js side of the package test installs beside the
// client: the WebSocket and EventSource it injects. Pinned, so a new
// release cannot change what the test proves.
const (
	wsPackage          = "ws@8.18.3"
	eventSourcePackage = "eventsource@4.1.1"
)

// watchScript runs the installed package in Node.js: it watches one task
// over the transport it is given and prints each state and task event as a
// JSON line.
const watchScript = `import { PushdClient } from '@pushd/client';
import WebSocket from 'ws';
import { EventSource } from 'eventsource';

const [url, token, transport, task] = process.argv.slice(2);
const client = new PushdClient({ url, token, transport, tasks: [task], WebSocket, EventSource });
const say = (v) => console.log(JSON.stringify(v));
client.addEventListener('state', (e) => say({ state: e.detail.state }));
client.addEventListener('task', (e) => say({ task: e.detail.task.task_id, version: e.detail.task.version }));
client.start();
process.on('SIGTERM', () => { client.close(); process.exit(0); });
`

// TestClientPackage packs web/client with npm, installs the tarball into a
// scratch project, and drives a real node with it: from Node.js over both
// transports (with the ws and eventsource packages injected) and from
// Chromium, importing the installed file. The package is the file the node
// serves, byte for byte.
func TestClientPackage(t *testing.T) {
	scratch := scratchProject(t, packClient(t), wsPackage, eventSourcePackage)
	installed := filepath.Join(scratch, "node_modules", "@pushd", "client")
	checkExports(t, installed)

	n := startNode(t, node.Config{})
	served := get(t, n.URL+"/client/pushd.js")
	if b, err := os.ReadFile(filepath.Join(installed, "pushd.js")); err != nil || !bytes.Equal(b, served) {
		t.Fatalf("the installed pushd.js is not the file the node serves (%v)", err)
	}

	t.Run("node", func(t *testing.T) {
		if err := os.WriteFile(filepath.Join(scratch, "watch.mjs"), []byte(watchScript), 0o644); err != nil {
			t.Fatal(err)
		}
		tok := demoToken(t, n.URL, "t1", "u1")
		task := "pkg_node"
		var watchers []*watcher
		for _, transport := range []string{"sse", "ws"} {
			w := startWatcher(t, scratch, n.URL, tok, transport, task)
			w.waitLine(t, `{"state":"streaming"}`)
			watchers = append(watchers, w)
		}
		for v := 1; v <= 3; v++ {
			publishTask(t, n.URL, task, v)
			for _, w := range watchers {
				w.waitLine(t, fmt.Sprintf(`{"task":%q,"version":%d}`, task, v))
			}
		}
	})

	t.Run("chromium", func(t *testing.T) {
		// The page and the installed package from one origin, the node's
		// routes behind it, as a site that bundles the client would serve
		// them.
		target, _ := url.Parse(n.URL)
		mux := http.NewServeMux()
		mux.Handle("/node_modules/", http.FileServer(http.Dir(scratch)))
		mux.HandleFunc("/page", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "text/html")
			io.WriteString(w, `<!doctype html><script type="importmap">{"imports":{"@pushd/client":"/node_modules/@pushd/client/pushd.js"}}</script>`)
		})
		mux.Handle("/", httputil.NewSingleHostReverseProxy(target))
		base := serve(t, mux)
		tok := demoToken(t, n.URL, "t1", "u1")
		task := "pkg_browser"
		publishTask(t, n.URL, task, 1)

		p := newBrowser(t).tab(t)
		p.do("navigate", chromedp.Navigate(base+"/page"))
		eval[bool](p, fmt.Sprintf(`import('@pushd/client').then(({ PushdClient }) => {
			window.seen = {};
			for (const transport of ['sse', 'ws']) {
				const c = new PushdClient({ token: %q, transport, tasks: [%q] });
				c.addEventListener('task', (e) => { window.seen[transport] = e.detail.task.version; });
				c.start();
			}
			return true;
		})`, tok, task))
		p.wait("version 1 on both transports", `window.seen && window.seen.sse === 1 && window.seen.ws === 1`)
		publishTask(t, n.URL, task, 2)
		p.wait("version 2 on both transports", `window.seen.sse === 2 && window.seen.ws === 2`)
	})
}

// packClient packs a copy of web/client with npm (so npm writes nothing
// into the repository), checks that the tarball holds the package's three
// files, and returns its path.
func packClient(t *testing.T) string {
	t.Helper()
	needTools(t, "node", "npm", "tar")
	src := t.TempDir()
	for _, name := range []string{"package.json", "pushd.js", "pushd.d.ts"} {
		b, err := os.ReadFile(filepath.Join("client", name))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(src, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	packs := t.TempDir()
	npm(t, src, "pack", "--pack-destination", packs)
	tarballs, _ := filepath.Glob(filepath.Join(packs, "*.tgz"))
	if len(tarballs) != 1 {
		t.Fatalf("npm pack made %v, want one tarball", tarballs)
	}
	listing, err := exec.Command("tar", "tzf", tarballs[0]).Output()
	if err != nil {
		t.Fatal(err)
	}
	files := strings.Fields(string(listing))
	slices.Sort(files)
	if want := []string{"package/package.json", "package/pushd.d.ts", "package/pushd.js"}; !slices.Equal(files, want) {
		t.Fatalf("the tarball holds %v, want %v", files, want)
	}
	return tarballs[0]
}

// scratchProject is a Node.js project (an ES module) in a directory of the
// test's own, with the packages installed from npm: names with versions,
// or tarballs.
func scratchProject(t *testing.T, packages ...string) string {
	t.Helper()
	needTools(t, "node", "npm")
	scratch := t.TempDir()
	if err := os.WriteFile(filepath.Join(scratch, "package.json"), []byte(`{"name":"scratch","private":true,"type":"module"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	npm(t, scratch, append([]string{"install", "--no-audit", "--no-fund", "--no-save"}, packages...)...)
	return scratch
}

func needTools(t *testing.T, tools ...string) {
	t.Helper()
	for _, tool := range tools {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("the test needs %s (scripts/test installs it): %v", tool, err)
		}
	}
}

// npm runs npm in dir and fails the test with its output if it fails.
func npm(t *testing.T, dir string, args ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*waitFor)
	defer cancel()
	cmd := exec.CommandContext(ctx, "npm", args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "npm_config_update_notifier=false", "npm_config_loglevel=warn")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("npm %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

// checkExports reads the installed package.json: its entry and its types
// must be files of the package.
func checkExports(t *testing.T, dir string) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "package.json"))
	if err != nil {
		t.Fatal(err)
	}
	var pkg struct {
		Name    string
		Version string
		Types   string
		Exports map[string]struct{ Types, Default string }
	}
	if err := json.Unmarshal(b, &pkg); err != nil {
		t.Fatal(err)
	}
	dot := pkg.Exports["."]
	if pkg.Name != "@pushd/client" || pkg.Version == "" || dot.Default == "" || dot.Types == "" || pkg.Types != dot.Types {
		t.Fatalf("package.json: name %q, version %q, exports %+v, types %q", pkg.Name, pkg.Version, pkg.Exports, pkg.Types)
	}
	for _, f := range []string{dot.Default, dot.Types} {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			t.Errorf("package.json names %s: %v", f, err)
		}
	}
}

func get(t *testing.T, u string) []byte {
	t.Helper()
	resp, err := http.Get(u)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %d %v", u, resp.StatusCode, err)
	}
	return b
}

// publishTask publishes version v of task, tenant t1 and user u1's.
func publishTask(t *testing.T, base, task string, v int) {
	t.Helper()
	publishDoc(t, base, fmt.Sprintf(`{"task_id":%q,"tenant_id":"t1","project_id":"p1","user_id":"u1","status":"RUNNING","progress":%d,"version":%d}`, task, 10*v, v))
}

// publishDoc publishes a snapshot document through the node's
// POST /v1/publish, as a loopback caller may without a key.
func publishDoc(t *testing.T, base, doc string) {
	t.Helper()
	resp, err := http.Post(base+"/v1/publish", "application/json", strings.NewReader(doc))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("publish %s: %d %s", doc, resp.StatusCode, b)
	}
}

// watcher is a Node.js process running watchScript.
type watcher struct {
	mu      sync.Mutex
	lines   []string
	changed chan struct{} // closed and replaced on each line
	exited  chan struct{}
	stderr  bytes.Buffer
}

func startWatcher(t *testing.T, dir, base, tok, transport, task string) *watcher {
	t.Helper()
	return startScript(t, dir, "watch.mjs", base, tok, transport, task)
}

// startScript runs a script of dir in Node.js with args, collecting the
// lines it prints, until the test ends.
func startScript(t *testing.T, dir, script string, args ...string) *watcher {
	t.Helper()
	w := &watcher{changed: make(chan struct{}), exited: make(chan struct{})}
	cmd := exec.Command("node", append([]string{script}, args...)...)
	cmd.Dir = dir
	cmd.Stderr = &w.stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		defer close(w.exited)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			w.mu.Lock()
			w.lines = append(w.lines, sc.Text())
			close(w.changed)
			w.changed = make(chan struct{})
			w.mu.Unlock()
		}
		cmd.Wait()
	}()
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		<-w.exited
	})
	return w
}

// waitLine waits until the process has printed line.
func (w *watcher) waitLine(t *testing.T, line string) {
	t.Helper()
	w.waitCount(t, line, 1)
}

// waitCount waits until the process has printed line n times.
func (w *watcher) waitCount(t *testing.T, line string, n int) {
	t.Helper()
	w.waitFor(t, fmt.Sprintf("%s %d times", line, n), func(lines []string) bool { return countOf(lines, line) >= n })
}

// waitFor waits until the lines the process has printed satisfy done, and
// returns them; what names the wait in a failure.
func (w *watcher) waitFor(t *testing.T, what string, done func(lines []string) bool) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	for {
		w.mu.Lock()
		lines, changed := slices.Clone(w.lines), w.changed
		w.mu.Unlock()
		if done(lines) {
			return lines
		}
		select {
		case <-changed:
		case <-w.exited:
			if lines := w.snapshot(); done(lines) {
				return lines
			}
			t.Fatalf("node exited without printing %s:\n%s\nstderr:\n%s", what, strings.Join(w.snapshot(), "\n"), w.stderr.String())
		case <-ctx.Done():
			t.Fatalf("node did not print %s within %v:\n%s", what, waitFor, strings.Join(lines, "\n"))
		}
	}
}

// count is how many times the process has printed line.
func (w *watcher) count(line string) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return countOf(w.lines, line)
}

// snapshot is every line the process has printed so far.
func (w *watcher) snapshot() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.lines)
}

func countOf(lines []string, line string) int {
	n := 0
	for _, l := range lines {
		if l == line {
			n++
		}
	}
	return n
}
