package web_test

import (
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pushd/pushd/node"
)

// refusedScript runs the installed package in Node.js as docs/CLIENT.md shows,
// with the ws and eventsource packages, and a short backoff; it prints its
// state, reconnecting, error and task events as JSON lines.
const refusedScript = `import { PushdClient } from '@pushd/client';
import WebSocket from 'ws';
import { EventSource } from 'eventsource';

const [url, token, transport, task] = process.argv.slice(2);
const client = new PushdClient({ url, token, transport, tasks: [task], WebSocket, EventSource,
  backoffBaseMs: 100, backoffMaxMs: 800, streamRetryMs: 500 });
const say = (v) => console.log(JSON.stringify(v));
client.addEventListener('state', (e) => say({ state: e.detail.state }));
client.addEventListener('reconnecting', (e) => say({ reconnecting: e.detail }));
client.addEventListener('error', (e) => say({ error: e.detail }));
client.addEventListener('task', (e) => say({ task: e.detail.task.task_id, version: e.detail.task.version }));
client.start();
process.on('SIGTERM', () => { client.close(); process.exit(0); });
`

// reconnecting is the detail of a reconnecting event.
type reconnecting struct {
	DelayMs float64 `json:"delayMs"`
	Reason  string  `json:"reason"`
	Attempt int     `json:"attempt"`
	Polling bool    `json:"polling"`
}

// A Node.js client, set up as docs/CLIENT.md's example is (the ws package's
// WebSocket, the eventsource package's EventSource), pointed at a port
// where nothing listens: every connect is refused. The process lives on,
// reports each refusal with a reconnecting event, backs off (each wait
// below min(backoffMaxMs, backoffBaseMs * 2^(attempt-1)), or the stream
// retry while polling), falls back to polling after three, and once a
// node listens on the port it streams from it. The ws package's WebSocket
// is an EventEmitter: an 'error' without a listener is thrown at the
// process, which the client used to let happen.
func TestNodeClientSurvivesRefusedConnections(t *testing.T) {
	scratch := scratchProject(t, packClient(t), wsPackage, eventSourcePackage)
	if err := os.WriteFile(filepath.Join(scratch, "refused.mjs"), []byte(refusedScript), 0o644); err != nil {
		t.Fatal(err)
	}
	// A port nothing listens on: taken, then given back.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()

	const (
		backoffBase, backoffMax = 100, 800 // refusedScript's options
		streamRetry             = 500
		attempts                = 6
	)
	tok := signedToken(t, "t1", "u1")
	reasons := map[string]string{"ws": "ws_close_1006", "sse": "stream_error"}
	var watchers []*watcher
	for _, transport := range transports {
		task := "refused_" + transport
		w := startScript(t, scratch, "refused.mjs", "http://"+addr, tok, transport, task)
		lines := w.waitFor(t, fmt.Sprintf("%d reconnecting events", attempts), func(lines []string) bool {
			return len(reconnects(t, lines)) >= attempts
		})
		for i, r := range reconnects(t, lines)[:attempts] {
			limit := float64(min(backoffMax, backoffBase<<(r.Attempt-1)))
			ok := r.Attempt == i+1 && r.Reason == reasons[transport] && r.DelayMs >= 0 && r.DelayMs < limit
			if r.Polling { // the stream retry is the least wait while polling
				ok = r.Attempt == i+1 && r.Reason == reasons[transport] && r.DelayMs >= streamRetry && r.DelayMs < max(limit, streamRetry+1)
			}
			if !ok {
				t.Fatalf("%s: reconnecting event %d is %+v: want attempt %d, reason %s, a wait below %v ms (or the stream retry while polling):\n%s",
					transport, i, r, i+1, reasons[transport], limit, strings.Join(lines, "\n"))
			}
		}
		w.waitLine(t, `{"state":"polling"}`)
		watchers = append(watchers, w)
	}

	n := startNodeOn(t, addr, node.Config{JWTSecret: testSecret})
	for _, w := range watchers {
		w.waitLine(t, `{"state":"streaming"}`)
	}
	for i, transport := range transports {
		task := "refused_" + transport
		publishTask(t, n.URL, task, 1)
		watchers[i].waitLine(t, fmt.Sprintf(`{"task":%q,"version":1}`, task))
	}
}

// reconnects are the reconnecting events among lines.
func reconnects(t *testing.T, lines []string) []reconnecting {
	t.Helper()
	var out []reconnecting
	for _, l := range lines {
		if !strings.HasPrefix(l, `{"reconnecting":`) {
			continue
		}
		var r struct{ Reconnecting reconnecting }
		if err := json.Unmarshal([]byte(l), &r); err != nil {
			t.Fatalf("%s: %v", l, err)
		}
		out = append(out, r.Reconnecting)
	}
	return out
}
