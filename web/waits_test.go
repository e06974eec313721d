package web_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/coder/websocket"

	"github.com/pushd/pushd/web"
)

// hostileWait is the wait the peers below name, in ms: past what a
// JavaScript timer can wait (2^31-1 ms), which fires such a wait at once.
const hostileWait = 3e9

// maxServerWait is pushd.js's MAX_SERVER_WAIT_MS.
const maxServerWait = 300000

// waitWindow is how long a client is watched for a storm after it starts.
const waitWindow = 2 * time.Second

// peerCounts is what a hostile peer saw.
type peerCounts struct {
	streams    atomic.Int64 // requests of /v1/events and /v1/ws, probes included
	polls      atomic.Int64 // requests of /v1/tasks and /v1/projects
	subscribes atomic.Int64 // WebSocket subscribe requests
	refreshes  atomic.Int64 // WebSocket refresh requests
}

// hostilePeer serves the page, pushd.js and, on /v1/, handler: a server
// that names absurd waits. The page and the client come from its origin.
// The handler's ctx ends when its client leaves or the test ends, which
// waits for every handler to return.
func hostilePeer(t *testing.T, c *peerCounts, handler func(ctx context.Context, w http.ResponseWriter, r *http.Request)) string {
	t.Helper()
	peer, stop := context.WithCancel(context.Background())
	var handlers sync.WaitGroup
	mux := http.NewServeMux()
	mux.Handle("/client/", http.StripPrefix("/client", web.Client()))
	mux.HandleFunc("/page", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html")
		io.WriteString(w, `<!doctype html><title>hostile</title>`)
	})
	mux.HandleFunc("/v1/", func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/v1/events", "/v1/ws":
			c.streams.Add(1)
		default:
			c.polls.Add(1)
		}
		handlers.Add(1)
		defer handlers.Done()
		ctx, cancel := context.WithCancel(r.Context())
		defer context.AfterFunc(peer, cancel)()
		defer cancel()
		handler(ctx, w, r)
	})
	base := serve(t, mux)
	t.Cleanup(func() { // before serve's: the handlers hold hijacked connections, which http.Server.Close leaves
		stop()
		handlers.Wait()
	})
	return base
}

// sseEvents answers an event stream with events (name, JSON data pairs);
// then it ends the stream, or with hold holds it open until the client
// leaves.
func sseEvents(ctx context.Context, w http.ResponseWriter, hold bool, events ...string) {
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-store")
	for i := 0; i+1 < len(events); i += 2 {
		fmt.Fprintf(w, "event: %s\ndata: %s\n\n", events[i], events[i+1])
	}
	w.(http.Flusher).Flush()
	if hold {
		<-ctx.Done()
	}
}

// wsConn accepts a WebSocket of subprotocol pushd.v1 and sends it msgs.
// With reply, it then reads the client's requests, counts its subscribes
// and refreshes, and answers each subscribe with reply(id) until the
// client leaves; without, it
// closes the connection with 1012, as a draining node does.
func wsConn(ctx context.Context, t *testing.T, w http.ResponseWriter, r *http.Request, c *peerCounts, reply func(id int) string, msgs ...string) {
	conn, err := websocket.Accept(w, r, &websocket.AcceptOptions{Subprotocols: []string{"pushd.v1"}})
	if err != nil {
		t.Errorf("accept: %v", err)
		return
	}
	defer conn.CloseNow()
	for _, m := range msgs {
		if err := conn.Write(ctx, websocket.MessageText, []byte(m)); err != nil {
			return
		}
	}
	if reply == nil {
		conn.Close(websocket.StatusServiceRestart, "draining")
		return
	}
	for {
		_, b, err := conn.Read(ctx)
		if err != nil {
			return
		}
		var req struct {
			Op string
			ID int
		}
		if json.Unmarshal(b, &req) != nil {
			continue
		}
		if req.Op == "refresh" {
			c.refreshes.Add(1)
		}
		if req.Op != "subscribe" {
			continue
		}
		c.subscribes.Add(1)
		if m := reply(req.ID); m != "" {
			if err := conn.Write(ctx, websocket.MessageText, []byte(m)); err != nil {
				return
			}
		}
	}
}

func helloOf(heartbeatMS float64) string {
	return fmt.Sprintf(`{"type":"hello","conn_id":"c1","node":"hostile","mode":"push","heartbeat_ms":%.0f}`, heartbeatMS)
}

// clientRecord is what a client did in the window.
type clientRecord struct {
	Hellos       int
	Reconnects   int            // reconnecting events
	Reconnecting []reconnecting // the first ten
	Limits       int            // limited events
	Limited      []struct {     // the first ten
		Source       string  `json:"source"`
		RetryAfter   float64 `json:"retryAfter"`
		RetryAfterMs float64 `json:"retryAfterMs"`
	}
	Arms    int     // timers the client armed
	Longest float64 // the longest wait it armed one for, in ms
}

// recordClient is JavaScript that wraps setTimeout to count the timers
// pushd.js arms (those whose caller is in pushd.js), and records a client
// c's hello, reconnecting and limited events, all in rec.
const recordClient = `const rec = { Hellos: 0, Reconnects: 0, Reconnecting: [], Limits: 0, Limited: [], Arms: 0, Longest: 0 };
const timer = globalThis.setTimeout;
globalThis.setTimeout = function (fn, ms, ...args) {
	if ((new Error().stack.split('\n')[2] || '').includes('pushd.js')) {
		rec.Arms++;
		rec.Longest = Math.max(rec.Longest, Number(ms) || 0);
	}
	return timer.call(globalThis, fn, ms, ...args);
};
const watch = (c) => {
	c.addEventListener('hello', () => rec.Hellos++);
	c.addEventListener('reconnecting', (e) => rec.Reconnects++ < 10 && rec.Reconnecting.push(e.detail));
	c.addEventListener('limited', (e) => rec.Limits++ < 10 && rec.Limited.push(e.detail));
};
`

// watchFunc starts a pushd.js client of base with options (a JavaScript
// object, without url), and once ready (a JavaScript condition on rec, a
// clientRecord, and client) holds and waitWindow has passed since the
// start, returns what it did.
type watchFunc func(t *testing.T, base, options, ready string) clientRecord

// watchInChromium runs the client in a tab of b, loaded from base.
func watchInChromium(b *browser) watchFunc {
	return func(t *testing.T, base, options, ready string) clientRecord {
		t.Helper()
		p := b.tab(t)
		p.do("navigate", chromedp.Navigate(base+"/page"))
		eval[bool](p, `(() => {
			`+recordClient+`
			window.__rec = rec;
			return import('/client/pushd.js').then((m) => {
				const client = window.__client = new m.PushdClient({ url: location.origin, ...`+options+` });
				watch(client);
				window.__t0 = Date.now();
				client.start();
				return true;
			});
		})()`)
		p.wait("the client ready", `((rec, client) => `+ready+`)(window.__rec, window.__client)`)
		p.wait("the end of the window", fmt.Sprintf(`Date.now() - window.__t0 >= %d`, waitWindow.Milliseconds()))
		rec := eval[clientRecord](p, `window.__rec`)
		eval[bool](p, `(window.__client.close(), true)`)
		return rec
	}
}

// waitScript is watchInNode's: it prints the record as a JSON line once
// the window is over, and exits.
const waitScript = `import { PushdClient } from '@pushd/client';
import WebSocket from 'ws';
import { EventSource } from 'eventsource';
` + recordClient + `
const [url, options, ready, windowMs] = process.argv.slice(2);
const client = new PushdClient({ url, ...new Function('return ' + options)(), WebSocket, EventSource });
watch(client);
const isReady = new Function('rec', 'client', 'return ' + ready);
const t0 = Date.now();
client.start();
const tick = setInterval(() => {
	if (!isReady(rec, client) || Date.now() - t0 < Number(windowMs)) return;
	clearInterval(tick);
	client.close();
	console.log(JSON.stringify(rec));
	process.exit(0);
}, 10);
process.on('SIGTERM', () => process.exit(0));
`

// watchInNode runs the client in Node.js, from the package installed in
// scratch with the ws and eventsource packages.
func watchInNode(scratch string) watchFunc {
	return func(t *testing.T, base, options, ready string) clientRecord {
		t.Helper()
		w := startScript(t, scratch, "waits.mjs", base, options, ready, fmt.Sprint(waitWindow.Milliseconds()))
		lines := w.waitFor(t, "the record", func(lines []string) bool { return len(lines) > 0 })
		var rec clientRecord
		if err := json.Unmarshal([]byte(lines[0]), &rec); err != nil {
			t.Fatalf("%s: %v", lines[0], err)
		}
		return rec
	}
}

// A server that names a wait of 3e9 ms (past what a timer can wait, which
// fires such a wait at once) in any of the places a wait comes from does
// not set off a storm: the client takes it as MAX_SERVER_WAIT_MS (5
// minutes), or MAX_HEARTBEAT_MS for heartbeat_ms, and in a 2 s window
// connects, subscribes and polls once and arms a handful of timers. The
// client before the ceiling made about a thousand of one of those in the
// window.
func TestClientBoundsTheWaitsAServerNames(t *testing.T) {
	scratch := scratchProject(t, packClient(t), wsPackage, eventSourcePackage)
	if err := os.WriteFile(filepath.Join(scratch, "waits.mjs"), []byte(waitScript), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Run("chromium", func(t *testing.T) { testServerWaits(t, watchInChromium(newBrowser(t))) })
	t.Run("node", func(t *testing.T) { testServerWaits(t, watchInNode(scratch)) })
}

func testServerWaits(t *testing.T, watchClient watchFunc) {
	const arms = 10 // timers a client arms in the window, at most: hello, liveness, retry, probe, poll
	options := func(transport, extra string) string {
		return fmt.Sprintf(`{ token: 'x', transport: %q, tasks: ['a'], backoffBaseMs: 10 %s }`, transport, extra)
	}
	check := func(t *testing.T, what string, got, max int64) {
		t.Helper()
		if got > max {
			t.Errorf("%d %s in %v, want at most %d", got, what, waitWindow, max)
		}
	}
	watch := func(t *testing.T, base, options, ready string) clientRecord {
		t.Helper()
		rec := watchClient(t, base, options, ready)
		if rec.Longest >= math.MaxInt32 {
			t.Errorf("the client armed a timer for %v ms, past what a timer can wait", rec.Longest)
		}
		check(t, "timers armed", int64(rec.Arms), arms)
		return rec
	}

	for _, transport := range transports {
		t.Run(transport+"/reconnect after_ms", func(t *testing.T) {
			var c peerCounts
			base := hostilePeer(t, &c, func(ctx context.Context, w http.ResponseWriter, r *http.Request) {
				if transport == "sse" {
					sseEvents(ctx, w, false, "hello", helloOf(25000), "reconnect", fmt.Sprintf(`{"after_ms":%.0f}`, hostileWait))
					return
				}
				wsConn(ctx, t, w, r, &c, nil, helloOf(25000), fmt.Sprintf(`{"type":"reconnect","after_ms":%.0f}`, hostileWait))
			})
			rec := watch(t, base, options(transport, ""), `rec.Reconnects > 0`)
			check(t, "connects", c.streams.Load(), 1)
			if rec.Reconnects != 1 || rec.Reconnecting[0].Reason != "server_reconnect" || rec.Reconnecting[0].DelayMs != maxServerWait {
				t.Errorf("%d reconnecting events %+v, want one of server_reconnect after %d ms", rec.Reconnects, rec.Reconnecting, maxServerWait)
			}
		})

		t.Run(transport+"/Retry-After", func(t *testing.T) {
			var c peerCounts
			base := hostilePeer(t, &c, func(ctx context.Context, w http.ResponseWriter, r *http.Request) {
				// A proxy's 429, its body not pushd's, to streams, probes and polls alike.
				w.Header().Set("Retry-After", fmt.Sprintf("%.0f", hostileWait/1000))
				http.Error(w, "slow down", http.StatusTooManyRequests)
			})
			rec := watch(t, base, options(transport, ", fallbackAfter: 1"), `rec.Reconnects > 0 && client.stats.polls > 0`)
			check(t, "connects and probes", c.streams.Load(), 2)
			check(t, "polls", c.polls.Load(), 1)
			if rec.Reconnects != 1 || rec.Reconnecting[0].Reason != "http_429" || rec.Reconnecting[0].DelayMs != maxServerWait {
				t.Errorf("%d reconnecting events %+v, want one of http_429 after %d ms", rec.Reconnects, rec.Reconnecting, maxServerWait)
			}
			for _, l := range rec.Limited {
				if l.RetryAfterMs != maxServerWait || l.RetryAfter != maxServerWait/1000 {
					t.Errorf("limited events %+v, want each of a wait of %d ms", rec.Limited, maxServerWait)
					break
				}
			}
		})

		t.Run(transport+"/heartbeat_ms", func(t *testing.T) {
			var c peerCounts
			base := hostilePeer(t, &c, func(ctx context.Context, w http.ResponseWriter, r *http.Request) {
				if transport == "sse" {
					sseEvents(ctx, w, true, "hello", helloOf(hostileWait))
					return
				}
				wsConn(ctx, t, w, r, &c, func(int) string { return "" }, helloOf(hostileWait))
			})
			rec := watch(t, base, options(transport, ""), `rec.Hellos > 0`)
			check(t, "connects", c.streams.Load(), 1)
			if rec.Reconnects != 0 {
				t.Errorf("%d reconnecting events %+v on a connection that stayed up", rec.Reconnects, rec.Reconnecting)
			}
		})
	}

	t.Run("ws/retry_after_ms in an ack", func(t *testing.T) {
		var c peerCounts
		base := hostilePeer(t, &c, func(ctx context.Context, w http.ResponseWriter, r *http.Request) {
			wsConn(ctx, t, w, r, &c, func(id int) string {
				return fmt.Sprintf(`{"type":"ack","id":%d,"rejected":[{"task_id":"a","code":"rate_limit_exceeded","retry_after":%.0f,"retry_after_ms":%.0f}]}`,
					id, hostileWait/1000, hostileWait)
			}, helloOf(25000))
		})
		rec := watch(t, base, options("ws", ""), `rec.Limits > 0`)
		check(t, "connects", c.streams.Load(), 1)
		check(t, "subscribes", c.subscribes.Load(), 1)
		if rec.Limits != 1 || rec.Limited[0].Source != "subscribe" || rec.Limited[0].RetryAfterMs != maxServerWait {
			t.Errorf("%d limited events %+v, want one for the subscribe, of %d ms", rec.Limits, rec.Limited, maxServerWait)
		}
	})

	// Not a wait a server names but one a token does: a JWT whose exp is
	// 30,000 years away is refreshed a minute before it, which a timer
	// cannot wait for.
	t.Run("ws/a token's exp", func(t *testing.T) {
		var c peerCounts
		base := hostilePeer(t, &c, func(ctx context.Context, w http.ResponseWriter, r *http.Request) {
			wsConn(ctx, t, w, r, &c, func(id int) string { return fmt.Sprintf(`{"type":"ack","id":%d,"rejected":[]}`, id) }, helloOf(25000))
		})
		b64 := base64.RawURLEncoding.EncodeToString
		jwt := b64([]byte(`{"alg":"HS256","typ":"JWT"}`)) + "." + b64([]byte(`{"sub":"u1","exp":1000000000000}`)) + ".c2ln"
		rec := watch(t, base, fmt.Sprintf(`{ token: async () => %q, transport: 'ws', tasks: ['a'] }`, jwt), `rec.Hellos > 0`)
		check(t, "connects", c.streams.Load(), 1)
		check(t, "refreshes", c.refreshes.Load(), 0)
		if rec.Reconnects != 0 {
			t.Errorf("%d reconnecting events %+v on a connection that stayed up", rec.Reconnects, rec.Reconnecting)
		}
	})

	t.Run("sse/retry_after_ms in an error event", func(t *testing.T) {
		var c peerCounts
		base := hostilePeer(t, &c, func(ctx context.Context, w http.ResponseWriter, r *http.Request) {
			sseEvents(ctx, w, true, "hello", helloOf(25000),
				"error", fmt.Sprintf(`{"code":"rate_limit_exceeded","task_id":"a","retry_after":%.0f,"retry_after_ms":%.0f}`, hostileWait/1000, hostileWait))
		})
		rec := watch(t, base, options("sse", ""), `rec.Limits > 0`)
		check(t, "connects", c.streams.Load(), 1)
		if rec.Limits != 1 || rec.Limited[0].RetryAfterMs != maxServerWait {
			t.Errorf("%d limited events %+v, want one of %d ms", rec.Limits, rec.Limited, maxServerWait)
		}
	})

	t.Run("sse/retry_after_ms in a refusal in the stream", func(t *testing.T) {
		var c peerCounts
		base := hostilePeer(t, &c, func(ctx context.Context, w http.ResponseWriter, r *http.Request) {
			sseEvents(ctx, w, false,
				"error", fmt.Sprintf(`{"error":"rate_limit_exceeded","message":"slow down","retry_after":%.0f,"retry_after_ms":%.0f}`, hostileWait/1000, hostileWait))
		})
		rec := watch(t, base, options("sse", ""), `rec.Reconnects > 0`)
		check(t, "connects", c.streams.Load(), 1)
		if rec.Reconnects != 1 || rec.Reconnecting[0].Reason != "http_429" || rec.Reconnecting[0].DelayMs != maxServerWait {
			t.Errorf("%d reconnecting events %+v, want one of http_429 after %d ms", rec.Reconnects, rec.Reconnecting, maxServerWait)
		}
	})
}
