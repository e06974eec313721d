package web_test

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/pushd/pushd/internal/testenv"
	"github.com/pushd/pushd/node"
)

// liveRecord is what the page recorded of one client.
type liveRecord struct {
	Hellos       int
	Heartbeats   int
	WatchedMS    int64 // from the first hello to the heartbeat that made Heartbeats
	Reconnecting []struct {
		Reason   string
		SilentMS int64 // since the last heartbeat the page saw
	}
	Received, Dropped int
	Moving, Still     int64 // the versions the client holds
}

// TestClientReconnectsASilentConnection is the liveness rule in Chromium,
// on each transport: a pushd.js connection on which heartbeats arrive stays
// up, idle, for longer than heartbeat_ms plus HEARTBEAT_GRACE_MS, the
// silence after which the client takes it for dead; once its link goes
// silent without closing (a proxy stops moving bytes, no FIN, no RST), the
// client reconnects after about that silence, and resumes: it receives the
// version its watched task reached meanwhile, and not again the version it
// holds of the task that did not move.
func TestClientReconnectsASilentConnection(t *testing.T) {
	const heartbeat = time.Second
	cfg := node.Config{JWTSecret: testSecret}
	cfg.Hub.HeartbeatInterval = heartbeat
	// The page is the node's; its clients stream through the proxy, another
	// origin: its connections are the only ones the stall silences.
	cfg.API.OriginPatterns = []string{"127.0.0.1:*"}
	n := startNode(t, cfg)
	proxy := testenv.StartProxy(t, strings.TrimPrefix(n.URL, "http://"))

	tenant := testenv.UniqueID("live")
	tasks := map[string][2]string{} // transport -> the moving and the still task
	publish := func(id string, version int) {
		t.Helper()
		d := fmt.Sprintf(`{"task_id":%q,"tenant_id":%q,"user_id":"u1","status":"RUNNING","version":%d,"updated_at":%d}`,
			id, tenant, version, time.Now().UnixMilli())
		if resp, body := do(t, http.MethodPost, n.URL+"/v1/publish", "", d); resp.StatusCode != http.StatusOK {
			t.Fatalf("publish %s: %d %s", id, resp.StatusCode, body)
		}
	}
	for _, transport := range transports {
		tasks[transport] = [2]string{testenv.UniqueID("moving"), testenv.UniqueID("still")}
		publish(tasks[transport][0], 1)
		publish(tasks[transport][1], 1)
	}

	// Both clients in one page, so their waits overlap.
	p := newBrowser(t).tab(t)
	p.do("navigate", chromedp.Navigate(n.URL+"/healthz")) // any page of the origin
	grace := eval[int64](p, fmt.Sprintf(`import('/client/pushd.js').then((m) => {
		window.__live = {};
		for (const [transport, tasks] of Object.entries(%s)) {
			const c = new m.PushdClient({ url: %q, token: %q, tasks, transport, backoffBaseMs: 100 });
			const r = { c, hellos: 0, firstHello: 0, heartbeats: 0, lastBeat: 0, watched: 0, reconnecting: [] };
			c.addEventListener('hello', () => { if (!r.hellos++) r.firstHello = Date.now(); });
			c.addEventListener('reconnecting', (e) => r.reconnecting.push({ reason: e.detail.reason, silentMS: Date.now() - r.lastBeat }));
			// Heartbeats are no event of the client's: the page notes when
			// its count moves, within 20 ms.
			setInterval(() => {
				if (c.stats.heartbeats === r.heartbeats) return;
				r.heartbeats = c.stats.heartbeats;
				r.lastBeat = Date.now();
				if (r.hellos === 1) r.watched = r.lastBeat - r.firstHello;
			}, 20);
			window.__live[transport] = r;
			c.start();
		}
		return m.HEARTBEAT_GRACE_MS;
	})`, jsTasks(tasks), "http://"+proxy.Addr, signedToken(t, tenant, "u1")))
	limit := heartbeat.Milliseconds() + grace

	record := func(transport string) liveRecord {
		t.Helper()
		mv, st := tasks[transport][0], tasks[transport][1]
		return eval[liveRecord](p, fmt.Sprintf(`((r) => ({
			Hellos: r.hellos, Heartbeats: r.heartbeats, WatchedMS: r.watched,
			Reconnecting: r.reconnecting.map((x) => ({ Reason: x.reason, SilentMS: x.silentMS })),
			Received: r.c.stats.received, Dropped: r.c.stats.dropped,
			Moving: r.c.task(%q)?.version ?? 0, Still: r.c.task(%q)?.version ?? 0,
		}))(window.__live[%q])`, mv, st, transport))
	}

	// Idle and healthy: heartbeats flow for longer than the silence the
	// client waits out, and it stays on its first connection.
	beats := int(limit/heartbeat.Milliseconds()) + 2
	for _, transport := range transports {
		p.wait(transport+" heartbeats for longer than the silence limit",
			fmt.Sprintf(`window.__live[%q].heartbeats >= %d`, transport, beats))
	}
	for _, transport := range transports {
		r := record(transport)
		if r.Hellos != 1 || len(r.Reconnecting) != 0 {
			p.fatalf("%s: %d hellos, reconnects %+v while heartbeats flowed; want one connection", transport, r.Hellos, r.Reconnecting)
		}
		if r.WatchedMS <= limit {
			p.fatalf("%s: %d heartbeats within %d ms, not past the silence limit of %d ms", transport, r.Heartbeats, r.WatchedMS, limit)
		}
		if r.Moving != 1 || r.Still != 1 {
			p.fatalf("%s: holds versions %d and %d, want 1 and 1", transport, r.Moving, r.Still)
		}
	}

	proxy.Stall()
	for _, transport := range transports {
		publish(tasks[transport][0], 2)
	}
	for _, transport := range transports {
		p.wait(transport+" the moved task's new version after the reconnect",
			fmt.Sprintf(`window.__live[%q].c.task(%q)?.version === 2`, transport, tasks[transport][0]))
	}
	for _, transport := range transports {
		r := record(transport)
		if len(r.Reconnecting) == 0 || r.Reconnecting[0].Reason != "silent" {
			p.fatalf("%s: reconnects %+v, want the first for silence", transport, r.Reconnecting)
		}
		// The page notes a heartbeat up to a timer's lateness after it
		// came; the upper bound is loose, for a busy machine, and far below
		// what the operating system takes to give up on a silent link.
		if s := r.Reconnecting[0].SilentMS; s < limit-1000 || s > limit+10000 {
			p.fatalf("%s: reconnected after %d ms of silence, want about %d", transport, s, limit)
		}
		t.Logf("%s: reconnected after %d ms of silence (limit %d ms)", transport, r.Reconnecting[0].SilentMS, limit)
		if r.Hellos != 2 || r.Still != 1 || r.Received != 3 || r.Dropped != 0 {
			p.fatalf("%s: %d hellos, %d snapshots received, %d dropped, still task at %d: want a resume that sent only the moved task",
				transport, r.Hellos, r.Received, r.Dropped, r.Still)
		}
	}
}

// jsTasks is a JavaScript object of each transport's task ids.
func jsTasks(tasks map[string][2]string) string {
	var b strings.Builder
	b.WriteString("{")
	for transport, ids := range tasks {
		fmt.Fprintf(&b, "%q: [%q, %q],", transport, ids[0], ids[1])
	}
	b.WriteString("}")
	return b.String()
}
