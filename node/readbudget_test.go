package node_test

import (
	"encoding/json"
	"net/url"
	"slices"
	"testing"
	"time"

	"github.com/pushd/pushd/hub"
	"github.com/pushd/pushd/internal/testenv"
)

// TestSubscribeFloodStaysWithinReadBudget: one user subscribing to fresh
// random ids as fast as its WebSocket allows reaches PostgreSQL at most its
// read budget, is told rate_limit_exceeded with when to come back (in
// seconds and milliseconds that agree), and costs
// nothing to another user of its tenant or to another tenant.
func TestSubscribeFloodStaysWithinReadBudget(t *testing.T) {
	c := newCluster(t)
	cfg := c.config()
	const rate, burst = 20, 50
	cfg.Hub.SubscribeReads, cfg.Hub.SubscribeReadBurst = rate, burst
	cfg.WS.RequestRate, cfg.WS.RequestBurst = 10000, 10000 // the request limit is not what this test is about
	s := startNode(t, cfg)
	own, other := testenv.UniqueID("task"), testenv.UniqueID("task")
	c.goPublish(t, doc(own, "t1", 1, "RUNNING"))
	c.goPublish(t, doc(other, "t2", 1, "RUNNING"))

	flood := openWS(t, s.URL, token(t, "t1", "flooder"))
	before := s.Store().Stats().DBQueries
	start := time.Now()
	limited, retryAfter := 0, int64(0)
	for round := 1; time.Since(start) < 2*time.Second; round++ {
		ids := make([]string, 100)
		for i := range ids {
			ids[i] = testenv.UniqueID("task")
		}
		flood.send(t, map[string]any{"op": "subscribe", "id": 2 * round, "tasks": ids})
		var ack struct {
			Rejected []struct {
				Code         string `json:"code"`
				TaskID       string `json:"task_id"`
				RetryAfter   *int64 `json:"retry_after"`
				RetryAfterMS int64  `json:"retry_after_ms"`
			} `json:"rejected"`
		}
		raw := rawMessage(flood.NextOf(t, "ack"))
		json.Unmarshal(raw, &ack)
		for _, r := range ack.Rejected {
			if r.Code == hub.CodeRateLimitExceeded {
				limited++
				if r.TaskID == "" {
					t.Fatalf("a refusal without its task_id: %s", raw)
				}
				wantWait(t, string(raw), r.RetryAfter, r.RetryAfterMS)
				retryAfter = r.RetryAfterMS
			}
		}
		flood.send(t, map[string]any{"op": "unsubscribe", "id": 2*round + 1, "tasks": ids})
		flood.NextOf(t, "ack")
	}
	elapsed := time.Since(start)
	queries := s.Store().Stats().DBQueries - before
	budget := uint64(burst + rate*elapsed.Seconds() + 1)
	t.Logf("flood of %v: %d ids refused rate_limit_exceeded (last retry_after_ms %d), %d PostgreSQL queries, budget %d", elapsed, limited, retryAfter, queries, budget)
	if limited == 0 {
		t.Fatal("no id was refused: the flood had no read budget")
	}
	if queries > budget {
		t.Fatalf("the flood caused %d PostgreSQL queries in %v, want at most its budget %d", queries, elapsed, budget)
	}
	if got := testenv.Scrape(t, s.AdminURL)["pushd_subscribe_reads_limited_total"]; got != float64(limited) {
		t.Fatalf("pushd_subscribe_reads_limited_total %v, want the %d ids refused", got, limited)
	}

	// Another user of the tenant, and another tenant, read as before.
	for _, who := range []struct{ tenant, user, task string }{{"t1", "neighbour", own}, {"t2", "u2", other}} {
		w := openWS(t, s.URL, token(t, who.tenant, who.user))
		w.send(t, map[string]any{"op": "subscribe", "id": 1, "tasks": []string{who.task}})
		if snap := w.nextTask(t); snap.TaskID != who.task {
			t.Fatalf("%s/%s got %s", who.tenant, who.user, snap.TaskID)
		}
		if ack := rawString(w.NextOf(t, "ack")); ack != `{"id":1,"rejected":[],"type":"ack"}` {
			t.Fatalf("%s/%s: %s", who.tenant, who.user, ack)
		}
	}
}

func rawMessage(m map[string]json.RawMessage) []byte {
	b, _ := json.Marshal(m)
	return b
}

// TestReconnectIsChargedOnlyForWhatIsNew: an SSE client asks again for ids
// refused for its read budget by reconnecting with every id it holds. What
// its closed connection watched costs nothing to watch again, so the
// reconnect is charged only for what is new and the client gets further
// each time; another user of the tenant is charged for the same ids as
// for fresh ones. The budget here never refills within the test, so every
// free read is the grace's, and both connections are confirmed closed and
// the node's cache cold before the next connect, so none is an old
// connection's or the cache's.
func TestReconnectIsChargedOnlyForWhatIsNew(t *testing.T) {
	c := newCluster(t)
	cfg := c.config()
	cfg.Hub.SubscribeReads, cfg.Hub.SubscribeReadBurst = 0.0001, 2
	cfg.SSE.CheckInterval = 20 * time.Millisecond
	s := startNode(t, cfg)
	ids := make([]string, 6)
	q := url.Values{}
	for i := range ids {
		ids[i] = testenv.UniqueID("task")
		c.goPublish(t, doc(ids[i], "t1", 1, "RUNNING"))
		q.Add("task", ids[i])
	}
	gone := func(cl *sseClient, held ...string) {
		cl.Close()
		testenv.Eventually(t, "the connection closed and its tasks uncached", func() bool {
			return testenv.Scrape(t, s.AdminURL)["pushd_connections"] == 0 &&
				!slices.ContainsFunc(held, func(id string) bool { return s.Store().Cached(id) != nil })
		})
	}

	reader := token(t, "t1", "reader")
	first := openSSE(t, s.URL, reader, q.Encode())
	wantSSE(t, first, ids[:2], ids[2:])
	gone(first, ids[:2]...)
	again := openSSE(t, s.URL, reader, q.Encode())
	wantSSE(t, again, ids[:2], ids[2:]) // 0 and 1 free; no read left for 2
	gone(again, ids[:2]...)

	other := openSSE(t, s.URL, token(t, "t1", "other"), url.Values{"task": ids[:3]}.Encode())
	wantSSE(t, other, ids[:2], ids[2:3]) // its own budget pays for 0 and 1
}

// wantSSE reads a connection's initial state: a task event for each of
// tasks and a rate_limit_exceeded error for each of refused, in any order.
func wantSSE(t *testing.T, cl *sseClient, tasks, refused []string) {
	t.Helper()
	var gotTasks, gotRefused []string
	for len(gotTasks)+len(gotRefused) < len(tasks)+len(refused) {
		ev := cl.Next(t)
		switch ev.Event {
		case "hello", "mode":
		case "task":
			gotTasks = append(gotTasks, parseDoc(t, ev.Data).TaskID)
		case "error":
			var e struct {
				Code   string `json:"code"`
				TaskID string `json:"task_id"`
			}
			json.Unmarshal([]byte(ev.Data), &e)
			if e.Code != hub.CodeRateLimitExceeded {
				t.Fatalf("error %s, want only %s", ev.Data, hub.CodeRateLimitExceeded)
			}
			gotRefused = append(gotRefused, e.TaskID)
		default:
			t.Fatalf("event %q (%s) before the initial state was complete", ev.Event, ev.Data)
		}
	}
	slices.Sort(gotTasks)
	slices.Sort(gotRefused)
	if !slices.Equal(gotTasks, slices.Sorted(slices.Values(tasks))) || !slices.Equal(gotRefused, slices.Sorted(slices.Values(refused))) {
		t.Fatalf("sent %v and refused %v, want %v sent and %v refused", gotTasks, gotRefused, tasks, refused)
	}
}

// TestSpentBudgetTellsNoHiddenTaskFromAnAbsentOne: once a user's read
// budget is spent, a task hidden from it, another tenant's or one of a
// project it is not granted, is answered rate_limit_exceeded exactly as an
// absent id is, though the node holds a fresh copy of it because others
// watch it; only a task the user sees is spared the budget by that copy.
// Before, the copy was asked by task id alone, and answered not_found.
func TestSpentBudgetTellsNoHiddenTaskFromAnAbsentOne(t *testing.T) {
	c := newCluster(t)
	cfg := c.config()
	cfg.Hub.SubscribeReads, cfg.Hub.SubscribeReadBurst = 0.001, 2 // spent for the whole test
	s := startNode(t, cfg)
	f := newGrantFixture(t, c) // f.p2: project P2, user u2; f.own: P2, u1
	other := testenv.UniqueID("t")
	foreign := testenv.UniqueID("task")
	c.goPublish(t, doc(foreign, other, 1, "RUNNING"))

	prober := openWS(t, s.URL, tokenFor(t, f.tenant, "P1")) // user u1, granted P1
	prober.send(t, map[string]any{"op": "subscribe", "id": 1, "tasks": []string{testenv.UniqueID("absent"), testenv.UniqueID("absent")}})
	prober.NextOf(t, "ack") // two not_found: the budget is spent

	codes := func(raw []byte) map[string]string {
		var ack struct {
			Rejected []struct {
				TaskID string `json:"task_id"`
				Code   string `json:"code"`
			} `json:"rejected"`
		}
		json.Unmarshal(raw, &ack)
		out := map[string]string{}
		for _, r := range ack.Rejected {
			out[r.TaskID] = r.Code
		}
		return out
	}
	watch := func(tok, task string) {
		w := openWS(t, s.URL, tok)
		w.send(t, map[string]any{"op": "subscribe", "id": 1, "tasks": []string{task}})
		if got := w.nextTask(t); got.TaskID != task {
			t.Fatalf("the watcher got %s, want %s", got.TaskID, task)
		}
		w.NextOf(t, "ack")
	}
	cached := func(id string) bool { return s.Store().Cached(id) != nil }
	// The node caches a copy for half a second: a round counts only when
	// the copies were there when the probe's ack came (only a read of the
	// id puts one back, and the probe's is the only one that could).
	for round := 1; ; round++ {
		watch(token(t, other, "u9"), foreign)
		watch(grantedToken(t, f.tenant, "u7", []string{"*"}), f.p2)  // users with budgets of their own
		watch(grantedToken(t, f.tenant, "u8", []string{"*"}), f.own) // the prober's own task
		absent := testenv.UniqueID("absent")
		prober.send(t, map[string]any{"op": "subscribe", "id": 2, "tasks": []string{absent, foreign, f.p2, f.own}})
		var own bool
		var raw []byte
		for raw == nil {
			m := prober.Next(t)
			switch msgType(m) {
			case "task":
				own = own || parseDoc(t, string(m["task"])).TaskID == f.own
			case "ack":
				raw = rawMessage(m)
			}
		}
		if !cached(foreign) || !cached(f.p2) || !cached(f.own) {
			if round == 20 {
				t.Fatal("in 20 rounds the node never held the copies through a probe")
			}
			prober.send(t, map[string]any{"op": "unsubscribe", "id": 3, "tasks": []string{f.own}})
			prober.NextOf(t, "ack")
			continue
		}
		got := codes(raw)
		for _, id := range []string{absent, foreign, f.p2} {
			if got[id] != hub.CodeRateLimitExceeded {
				t.Errorf("with the budget spent, %s was answered %q; want rate_limit_exceeded, as the absent id was (%q) (ack %s)", id, got[id], got[absent], raw)
			}
		}
		if !own || got[f.own] != "" {
			t.Errorf("the prober's own task, cached: delivered %v, rejected %q; want it delivered without the budget", own, got[f.own])
		}
		return
	}
}
