package web_test

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pushd/pushd/internal/testenv"
	"github.com/pushd/pushd/node"
)

// urlsScript runs the installed package in Node.js with a list of nodes
// instead of one URL; it prints each hello (the node's name and the URL
// the client used), each reconnecting event and each task event.
const urlsScript = `import { PushdClient } from '@pushd/client';
import WebSocket from 'ws';
import { EventSource } from 'eventsource';

const [urls, token, transport, task] = process.argv.slice(2);
const client = new PushdClient({ urls: urls.split(' '), token, transport, tasks: [task], WebSocket, EventSource,
  backoffBaseMs: 100, backoffMaxMs: 400 });
const say = (v) => console.log(JSON.stringify(v));
client.addEventListener('hello', (e) => say({ hello: e.detail.node, url: client.url }));
client.addEventListener('reconnecting', (e) => say({ reconnecting: e.detail }));
client.addEventListener('task', (e) => say({ task: e.detail.task.task_id, version: e.detail.task.version }));
client.start();
process.on('SIGTERM', () => { client.close(); process.exit(0); });
`

// A client given three nodes' URLs, with no balancer: the node it streams
// from is killed (its port refuses from then on), then the node it moved
// to drains. The client moves on after each, resumes, and ends streaming
// from the third with the task's newest version, never an older one after
// a newer.
func TestClientWithThreeURLsConvergesOnTheThird(t *testing.T) {
	scratch := scratchProject(t, packClient(t), wsPackage, eventSourcePackage)
	if err := os.WriteFile(filepath.Join(scratch, "urls.mjs"), []byte(urlsScript), 0o644); err != nil {
		t.Fatal(err)
	}
	redis := testenv.SharedRedis(t)
	pg := testenv.Database(t)
	tok := signedToken(t, "t1", "u1")
	for _, transport := range transports {
		t.Run(transport, func(t *testing.T) {
			var nodes [3]*testNode
			var proxies [3]*testenv.Proxy
			var urls []string
			for i := range nodes {
				nodes[i] = startNode(t, node.Config{RedisURL: redis.URL, KeyPrefix: redis.Names.Prefix, DatabaseURL: pg.URL, JWTSecret: testSecret})
				// The proxy is the node's address as the client knows it:
				// closed, it cuts every connection and refuses new ones.
				proxies[i] = testenv.StartProxy(t, strings.TrimPrefix(nodes[i].URL, "http://"))
				urls = append(urls, "http://"+proxies[i].Addr)
			}
			task := testenv.UniqueID("urls")
			publishTask(t, nodes[0].URL, task, 1)
			w := startScript(t, scratch, "urls.mjs", strings.Join(urls, " "), tok, transport, task)
			w.waitLine(t, fmt.Sprintf(`{"task":%q,"version":1}`, task))

			killed := helloFrom(t, w, nodes, nil)
			proxies[killed].Close()
			drained := helloFrom(t, w, nodes, []int{killed})
			publishTask(t, nodes[drained].URL, task, 2)
			w.waitLine(t, fmt.Sprintf(`{"task":%q,"version":2}`, task))
			nodes[drained].shutdown(t)
			third := helloFrom(t, w, nodes, []int{killed, drained})
			publishTask(t, nodes[third].URL, task, 3)
			lines := w.waitFor(t, "version 3", func(lines []string) bool {
				return countOf(lines, fmt.Sprintf(`{"task":%q,"version":3}`, task)) == 1
			})

			last, drainSeen := 0, false
			for _, l := range lines {
				var ev struct {
					Version      int
					Reconnecting *reconnecting
				}
				if err := json.Unmarshal([]byte(l), &ev); err != nil {
					t.Fatalf("%s: %v", l, err)
				}
				if ev.Version != 0 && ev.Version <= last {
					t.Fatalf("version %d after %d:\n%s", ev.Version, last, strings.Join(lines, "\n"))
				}
				last = max(last, ev.Version)
				drainSeen = drainSeen || ev.Reconnecting != nil && ev.Reconnecting.Reason == "server_reconnect"
			}
			if !drainSeen {
				t.Errorf("no reconnect for the drain's hint:\n%s", strings.Join(lines, "\n"))
			}
		})
	}
}

// helloFrom waits for a hello from a node not in not, and returns its
// index in nodes.
func helloFrom(t *testing.T, w *watcher, nodes [3]*testNode, not []int) int {
	t.Helper()
	found := -1
	w.waitFor(t, fmt.Sprintf("a hello from a node other than %v", not), func(lines []string) bool {
		for _, l := range lines {
			var h struct{ Hello string }
			if json.Unmarshal([]byte(l), &h) != nil || h.Hello == "" {
				continue
			}
			for i, n := range nodes {
				skip := false
				for _, j := range not {
					skip = skip || i == j
				}
				if n.Name == h.Hello && !skip {
					found = i
				}
			}
		}
		return found >= 0
	})
	return found
}
