package node_test

import (
	"encoding/json"
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
	cfg.SubscribeReads, cfg.SubscribeReadBurst = rate, burst
	cfg.WSRequestRate, cfg.WSRequestBurst = 10000, 10000 // the request limit is not what this test is about
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
		raw := rawMessage(flood.nextOf(t, "ack"))
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
		flood.nextOf(t, "ack")
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
	if got := scrape(t, s.URL)["pushd_subscribe_reads_limited_total"]; got != float64(limited) {
		t.Fatalf("pushd_subscribe_reads_limited_total %v, want the %d ids refused", got, limited)
	}

	// Another user of the tenant, and another tenant, read as before.
	for _, who := range []struct{ tenant, user, task string }{{"t1", "neighbour", own}, {"t2", "u2", other}} {
		w := openWS(t, s.URL, token(t, who.tenant, who.user))
		w.send(t, map[string]any{"op": "subscribe", "id": 1, "tasks": []string{who.task}})
		if snap := w.nextTask(t); snap.TaskID != who.task {
			t.Fatalf("%s/%s got %s", who.tenant, who.user, snap.TaskID)
		}
		if ack := rawString(w.nextOf(t, "ack")); ack != `{"id":1,"rejected":[],"type":"ack"}` {
			t.Fatalf("%s/%s: %s", who.tenant, who.user, ack)
		}
	}
}

func rawMessage(m map[string]json.RawMessage) []byte {
	b, _ := json.Marshal(m)
	return b
}
