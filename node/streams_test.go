package node_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pushd/pushd/fanout"
	"github.com/pushd/pushd/hub"
	"github.com/pushd/pushd/internal/testenv"
	"github.com/pushd/pushd/keys"
	"github.com/pushd/pushd/node"
	"github.com/pushd/pushd/snapshot"
	"github.com/pushd/pushd/stream"
	"github.com/pushd/pushd/stream/cursor"
)

// Per-tenant streams, resume cursors, replay.

func (c *cluster) streamConfig() node.Config {
	cfg := c.config()
	cfg.Streams = true
	return cfg
}

// streamPublish is the Task State Service with the streams option.
func streamPublish(t *testing.T, rdb *redis.Client, names keys.Names, d string) {
	t.Helper()
	if _, err := fanout.NewRedisPublisher(rdb, names, fanout.WithStream(10000)).Publish(context.Background(), parseDoc(t, d)); err != nil {
		t.Fatal(err)
	}
}

func tenantDoc(task, tenant string, version int64) string {
	return doc(task, tenant, version, "RUNNING")
}

// untilCursor reads tasks until an event carries a stream cursor (a task
// event, or the sync event that follows the initial state), and returns
// the tasks by id and the cursor. Events other than task, sync, and a
// not_found refusal fail the test.
func (c *sseClient) untilCursor(t *testing.T) (map[string]*snapshot.Snapshot, string) {
	t.Helper()
	got := make(map[string]*snapshot.Snapshot)
	for {
		ev := c.Next(t)
		switch ev.Event {
		case "hello", "mode":
			continue
		case "task":
			s := parseDoc(t, ev.Data)
			if prev := got[s.TaskID]; prev != nil && prev.Version >= s.Version {
				t.Fatalf("task %s went from v%d to v%d", s.TaskID, prev.Version, s.Version)
			}
			got[s.TaskID] = s
		case "sync":
		case "error":
			if !strings.Contains(ev.Data, `"not_found"`) {
				t.Fatalf("unexpected error event: %s", ev.Data)
			}
		default:
			t.Fatalf("unexpected event %q: %s", ev.Event, ev.Data)
		}
		if cursor.Is(ev.ID) {
			return got, ev.ID
		}
	}
}

func TestResumeOnAnotherNodeSendsOnlyWhatMoved(t *testing.T) {
	c := newCluster(t)
	a := startNode(t, c.streamConfig())
	b := startNode(t, c.streamConfig())
	tenant := testenv.UniqueID("tenant")
	tasks := make([]string, 100)
	query := make([]string, 100)
	for i := range tasks {
		tasks[i] = testenv.UniqueID("task")
		query[i] = "task=" + tasks[i]
		streamPublish(t, c.redis.Client, c.redis.Names, tenantDoc(tasks[i], tenant, 1))
	}
	tok := token(t, tenant, "u1")
	first := openSSE(t, a.URL, tok, strings.Join(query, "&"))
	initial, cursor := first.untilCursor(t)
	if len(initial) != 100 {
		t.Fatalf("initial state: %d tasks before the cursor, want 100", len(initial))
	}
	first.Close()
	t.Logf("cursor after 100 tasks: %q (%d bytes)", cursor, len(cursor))

	// 50 changes hit 5 tasks while the client is away.
	moved := tasks[10:15]
	for v := int64(2); v <= 11; v++ {
		for _, id := range moved {
			streamPublish(t, c.redis.Client, c.redis.Names, tenantDoc(id, tenant, v))
		}
	}
	again := openSSE(t, b.URL, tok, strings.Join(query, "&"), "Last-Event-ID", cursor)
	got, cursor2 := again.untilCursor(t)
	for id, s := range got {
		if !strings.Contains(strings.Join(moved, ","), id) || s.Version != 11 {
			t.Fatalf("resume sent %s v%d; want only the 5 moved tasks at v11", id, s.Version)
		}
	}
	if len(got) != 5 {
		t.Fatalf("resume sent %d tasks before its cursor, want 5", len(got))
	}
	// Nothing else is on its way: a change made now is the next event.
	streamPublish(t, c.redis.Client, c.redis.Names, tenantDoc(tasks[99], tenant, 2))
	if s := again.nextTask(t); s.TaskID != tasks[99] || s.Version != 2 {
		t.Fatalf("after the resume got %s v%d, want %s v2", s.TaskID, s.Version, tasks[99])
	}
	if cursor2 == cursor {
		t.Fatal("the resumed connection's cursor did not move")
	}
	st, ts := b.Hub().Stats(), b.Stream().Stats()
	t.Logf("node b: %d resume, %d entries replayed, %d tasks read for it, %d fallbacks", st.Resumes, ts.Replayed, st.ResumeTasks, st.ResumeFallbacks)
	if st.Resumes != 1 || ts.Replayed != 50 || st.ResumeTasks != 5 || st.ResumeFallbacks != 0 {
		t.Fatalf("node b: resumes %d, replayed %d, tasks %d, fallbacks %d; want 1, 50, 5, 0",
			st.Resumes, ts.Replayed, st.ResumeTasks, st.ResumeFallbacks)
	}
	wantMetric(t, b.AdminURL, `pushd_resume_replayed_entries_total 50`)
}

func TestUnusableCursorsGetAFullResyncOfTheClientsOwnTasks(t *testing.T) {
	c := newCluster(t)
	s := startNode(t, c.streamConfig())
	tenant, other := testenv.UniqueID("tenant"), testenv.UniqueID("tenant")
	mine := []string{testenv.UniqueID("task"), testenv.UniqueID("task"), testenv.UniqueID("task")}
	theirs := testenv.UniqueID("task")
	for _, id := range mine {
		streamPublish(t, c.redis.Client, c.redis.Names, tenantDoc(id, tenant, 3))
	}
	streamPublish(t, c.redis.Client, c.redis.Names, tenantDoc(theirs, other, 7))
	query := "task=" + strings.Join(mine, "&task=") + "&task=" + theirs
	tok := token(t, tenant, "u1")

	cursorOf := func(tenant, tok string) string {
		cl := openSSE(t, s.URL, tok, query)
		_, cur := cl.untilCursor(t)
		cl.Close()
		return cur
	}
	// expectFull resumes with cursor and wants every task of the client's
	// own, up to its current version, and nothing of the other tenant's:
	// the other tenant's task is refused as not found, as on a first
	// connect. The resync may first send a version the node cached a
	// moment ago, with the newer one's notification still on its way, so
	// it reads until each task is at version.
	expectFull := func(name, cursor string, version int64) {
		t.Helper()
		cl := openSSE(t, s.URL, tok, query, "Last-Event-ID", cursor)
		defer cl.Close()
		got := make(map[string]int64)
		notFound := false
		current := func() bool {
			for _, id := range mine {
				if got[id] != version {
					return false
				}
			}
			return true
		}
		for !current() || !notFound {
			ev := cl.Next(t)
			switch ev.Event {
			case "task":
				snap := parseDoc(t, ev.Data)
				if snap.TenantID != tenant {
					t.Fatalf("%s: another tenant's task reached the client: %s", name, ev.Data)
				}
				if snap.Version <= got[snap.TaskID] || snap.Version > version {
					t.Fatalf("%s: %s at v%d after v%d, want versions going up to v%d", name, snap.TaskID, snap.Version, got[snap.TaskID], version)
				}
				got[snap.TaskID] = snap.Version
			case "error":
				if !strings.Contains(ev.Data, `"not_found"`) || !strings.Contains(ev.Data, theirs) {
					t.Fatalf("%s: error event %s", name, ev.Data)
				}
				notFound = true
			}
		}
		for _, id := range mine {
			if got[id] != version {
				t.Fatalf("%s: %s at v%d, want v%d (full resync)", name, id, got[id], version)
			}
		}
	}

	forged := cursorOf(other, token(t, other, "u9"))
	expectFull("forged: another tenant's cursor", forged, 3)
	// The fingerprint of the query's subscription (the same for both
	// tenants), so the corrupt cursors reach the stream.
	fp := forged[strings.LastIndexByte(forged, '.'):]
	expectFull("corrupt", "s1.AAAA!"+fp, 3)
	expectFull("corrupt base64", "s1."+strings.Repeat("A", 22)+fp, 3)

	trimmed := cursorOf(tenant, tok)
	for v := int64(4); v <= 6; v++ {
		for _, id := range mine {
			streamPublish(t, c.redis.Client, c.redis.Names, tenantDoc(id, tenant, v))
		}
	}
	if err := c.redis.Client.XTrimMaxLen(context.Background(), c.redis.Names.Stream(tenant), 1).Err(); err != nil {
		t.Fatal(err)
	}
	expectFull("trimmed away", trimmed, 6)

	epoch := cursorOf(tenant, tok)
	if err := c.redis.Client.Del(context.Background(), c.redis.Names.Stream(tenant)).Err(); err != nil {
		t.Fatal(err) // Redis lost the stream
	}
	for _, id := range mine {
		streamPublish(t, c.redis.Client, c.redis.Names, tenantDoc(id, tenant, 7))
	}
	expectFull("other epoch", epoch, 7)

	ts := s.Stream().Stats()
	t.Logf("fallbacks by reason: %v", ts.ResumeFallbacks)
	for reason, want := range map[string]int64{stream.FallbackTenant: 1, stream.FallbackCorrupt: 2, stream.FallbackTrimmed: 1, stream.FallbackEpoch: 1} {
		if ts.ResumeFallbacks[reason] != want {
			t.Fatalf("fallbacks %v, want %d for %s", ts.ResumeFallbacks, want, reason)
		}
	}
	wantMetric(t, s.AdminURL, `pushd_resume_fallbacks_total{reason="trimmed"} 1`)
}

func TestPubSubGapIsClosedFromTheStreamWithoutResync(t *testing.T) {
	c := newPrivateCluster(t)
	cfg := c.config()
	cfg.Streams = true
	s := startNode(t, cfg)
	task := testenv.UniqueID("task")
	write := func(v int64) {
		c.pg.InsertTask(t, testenv.Task{ID: task, TenantID: "t1", ProjectID: "p1", UserID: "u1", Status: "RUNNING", Progress: int(v), Version: v})
		streamPublish(t, c.rdb, keys.Names{}, doc(task, "t1", v, "RUNNING"))
	}
	write(1)
	ws, last := watchers(t, s, task)
	for i, w := range ws {
		w.waitVersion(t, 1, &last[i])
	}
	ctx := context.Background()
	// The node may not subscribe again until the test allows it: the gap
	// lasts as long as the test wants. Then its subscription is killed.
	if err := c.rdb.Do(ctx, "ACL", "SETUSER", "default", "-subscribe").Err(); err != nil {
		t.Fatal(err)
	}
	if n, err := c.rdb.ClientKillByFilter(ctx, "TYPE", "pubsub").Result(); err != nil || n == 0 {
		t.Fatalf("CLIENT KILL TYPE pubsub: %d %v", n, err)
	}
	// Every change in the gap reaches every watcher, from the stream.
	for v := int64(2); v <= 6; v++ {
		write(v)
		for i, w := range ws {
			w.waitVersion(t, v, &last[i])
		}
	}
	if err := c.rdb.Do(ctx, "ACL", "SETUSER", "default", "+subscribe").Err(); err != nil {
		t.Fatal(err)
	}
	// The bus comes back, and its resubscription needs no re-read either.
	// A change announced on Pub/Sub alone (no stream entry, and no polling
	// while the stream covers) proves the subscription is back, and that
	// the tenant's Resync, which comes before it on the connection, was
	// handled.
	testenv.Eventually(t, "the bus subscribed again", func() bool {
		return c.rdb.PubSubNumSub(ctx, keys.Names{}.Channel("t1")).Val()[keys.Names{}.Channel("t1")] > 0
	})
	c.write(t, task, 7, true) // PUBLISH without XADD
	for i, w := range ws {
		w.waitVersion(t, 7, &last[i])
	}
	st := s.Hub().Stats()
	t.Logf("gap closed from the stream: %d catch-ups, %d full resyncs, %d poll rounds, %d mode switches, %d stream entries",
		st.CatchUps, st.Resyncs, st.Polls, st.ModeSwitches, s.Stream().Stats().Entries)
	// No full resync, and the stream took over the gap. A poll round may
	// still run: a tail that has not completed a read for 2 blocks plus a
	// second counts as unhealthy, and on a machine loaded enough (-race
	// beside the browser tests) the hub then polls rather than trust it,
	// as it should.
	if st.Resyncs != 0 || st.CatchUps == 0 {
		t.Fatalf("resyncs %d, catch-ups %d: want no resync and the gap closed from the stream",
			st.Resyncs, st.CatchUps)
	}
}

func TestRedisRestartedEmptyTheTailResyncsAndClientsConverge(t *testing.T) {
	c := newPrivateCluster(t)
	cfg := c.config()
	cfg.Streams = true
	s := startNode(t, cfg)
	task := testenv.UniqueID("task")
	write := func(v int64, announce bool) {
		c.pg.InsertTask(t, testenv.Task{ID: task, TenantID: "t1", ProjectID: "p1", UserID: "u1", Status: "RUNNING", Progress: int(v), Version: v})
		if announce {
			streamPublish(t, c.rdb, keys.Names{}, doc(task, "t1", v, "RUNNING"))
		}
	}
	write(1, true)
	ws, last := watchers(t, s, task)
	for i, w := range ws {
		w.waitVersion(t, 1, &last[i])
	}
	write(2, true)
	for i, w := range ws {
		w.waitVersion(t, 2, &last[i])
	}
	c.rs.Stop()
	write(3, false) // PostgreSQL moves on while Redis is down
	c.rs.Start()    // empty
	for i, w := range ws {
		w.waitVersion(t, 3, &last[i])
	}
	// The tail noticed that the stream it followed is gone.
	testenv.Eventually(t, "the tail noticed the lost stream", func() bool {
		r := s.Stream().Stats().TailResyncs
		return r[stream.ResyncBackwards]+r[stream.ResyncEpoch] > 0
	})
	t.Logf("tail resyncs after the restart: %v", s.Stream().Stats().TailResyncs)
	write(4, true)
	for i, w := range ws {
		w.waitVersion(t, 4, &last[i])
	}
}

func TestStreamStaysWithinItsBoundThroughTheNode(t *testing.T) {
	c := newCluster(t)
	cfg := c.streamConfig()
	cfg.StreamMaxLen = 50
	s := startNode(t, cfg)
	tenant := testenv.UniqueID("tenant")
	key := c.redis.Names.Stream(tenant)
	var most int64
	for i := range 600 {
		httpPublish(t, s.URL, tenantDoc(fmt.Sprintf("task_%d_%s", i%7, tenant), tenant, int64(i+1)))
		if i%25 == 0 {
			most = max(most, c.redis.Client.XLen(context.Background(), key).Val())
		}
	}
	n := c.redis.Client.XLen(context.Background(), key).Val()
	most = max(most, n)
	t.Logf("600 publishes through POST /v1/publish with --stream-maxlen 50: XLEN %d, at most %d", n, most)
	// MAXLEN ~ trims whole macro nodes of 100 entries: at most one over.
	if most > 50+100 || n < 50 {
		t.Fatalf("XLEN reached %d (now %d), want within [50, 150]", most, n)
	}
	resp, _ := httpDo(t, http.MethodGet, s.AdminURL+"/metrics", "", "")
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("/metrics %d", resp.StatusCode)
	}
}

// A stream cursor resumes only the subscription it was issued for: a
// client that adds a task to its URL (as pushd.js does on SSE when a page
// subscribes to another task) and brings the cursor of the smaller
// subscription is read everything, so the added task arrives even though
// it finished before the cursor and never moves again.
func TestStreamResumeWithAnAddedTaskSendsIt(t *testing.T) {
	c := newCluster(t)
	s := startNode(t, c.streamConfig())
	tenant := testenv.UniqueID("tenant")
	taskA, taskB := testenv.UniqueID("task"), testenv.UniqueID("task")
	streamPublish(t, c.redis.Client, c.redis.Names, tenantDoc(taskA, tenant, 1))
	streamPublish(t, c.redis.Client, c.redis.Names, doc(taskB, tenant, 1, "SUCCEEDED"))
	tok := token(t, tenant, "u1")

	first := openSSE(t, s.URL, tok, "task="+taskA)
	got, cursor := first.untilCursor(t)
	if len(got) != 1 || got[taskA] == nil {
		t.Fatalf("initial state: %v, want %s alone", got, taskA)
	}
	first.Close()

	both := "task=" + taskA + "&task=" + taskB
	grown := openSSE(t, s.URL, tok, both, "Last-Event-ID", cursor)
	got, cursor2 := grown.untilCursor(t)
	if b := got[taskB]; b == nil || b.Version != 1 || b.Status != "SUCCEEDED" {
		t.Fatalf("with %s added: got %v, want %s v1 SUCCEEDED", taskB, got, taskB)
	}
	// Task A may come again, once (untilCursor refuses a second copy).
	if a := got[taskA]; a != nil && a.Version != 1 {
		t.Fatalf("with %s added: got %s v%d, want v1 if anything", taskB, taskA, a.Version)
	}
	grown.Close()
	if fingerprintOf(cursor2) == fingerprintOf(cursor) {
		t.Fatalf("cursors %q and %q of different subscriptions have one fingerprint", cursor, cursor2)
	}

	// The grown subscription's cursor is its own: it resumes with a replay.
	streamPublish(t, c.redis.Client, c.redis.Names, tenantDoc(taskA, tenant, 2))
	again := openSSE(t, s.URL, tok, both, "Last-Event-ID", cursor2)
	got, _ = again.untilCursor(t)
	if a := got[taskA]; len(got) != 1 || a == nil || a.Version != 2 {
		t.Fatalf("resume of the grown subscription sent %v, want %s v2 alone", got, taskA)
	}

	st := s.Hub().Stats()
	if st.ResumeMismatches != 1 || st.ResumeFallbacks != 1 || st.Resumes != 1 || st.Reconnects[hub.TransportSSE] != 2 {
		t.Fatalf("mismatches %d, fallbacks %d, resumes %d, reconnects %d; want 1, 1, 1, 2",
			st.ResumeMismatches, st.ResumeFallbacks, st.Resumes, st.Reconnects[hub.TransportSSE])
	}
	wantMetric(t, s.AdminURL, `pushd_resume_fallbacks_total{reason="subscription"} 1`)
}

// The fingerprint is of the canonical subscription: the same tasks in
// another order, one repeated, resume with a replay of what moved.
func TestStreamResumeOfTheSameSubscriptionReorderedSendsOnlyWhatMoved(t *testing.T) {
	c := newCluster(t)
	s := startNode(t, c.streamConfig())
	tenant := testenv.UniqueID("tenant")
	taskA, taskB := testenv.UniqueID("task"), testenv.UniqueID("task")
	streamPublish(t, c.redis.Client, c.redis.Names, tenantDoc(taskA, tenant, 1))
	streamPublish(t, c.redis.Client, c.redis.Names, tenantDoc(taskB, tenant, 1))
	tok := token(t, tenant, "u1")

	first := openSSE(t, s.URL, tok, "task="+taskA+"&task="+taskB)
	got, cursor := first.untilCursor(t)
	if len(got) != 2 {
		t.Fatalf("initial state: %d tasks, want 2", len(got))
	}
	first.Close()

	streamPublish(t, c.redis.Client, c.redis.Names, tenantDoc(taskB, tenant, 2))
	again := openSSE(t, s.URL, tok, "task="+taskB+"&task="+taskA+"&task="+taskB, "Last-Event-ID", cursor)
	got, _ = again.untilCursor(t)
	if b := got[taskB]; len(got) != 1 || b == nil || b.Version != 2 {
		t.Fatalf("reordered resume sent %v, want %s v2 alone", got, taskB)
	}
	st := s.Hub().Stats()
	if st.Resumes != 1 || st.ResumeFallbacks != 0 {
		t.Fatalf("resumes %d, fallbacks %d; want 1 and 0", st.Resumes, st.ResumeFallbacks)
	}
}

// A stream cursor without a fingerprint, as nodes wrote before them, names
// no subscription: the connection is read everything, as a new client is.
func TestStreamCursorWithoutFingerprintGetsAFullRead(t *testing.T) {
	c := newCluster(t)
	s := startNode(t, c.streamConfig())
	tenant := testenv.UniqueID("tenant")
	tasks := []string{testenv.UniqueID("task"), testenv.UniqueID("task"), testenv.UniqueID("task")}
	for _, id := range tasks {
		streamPublish(t, c.redis.Client, c.redis.Names, tenantDoc(id, tenant, 1))
	}
	query := "task=" + strings.Join(tasks, "&task=")
	tok := token(t, tenant, "u1")

	first := openSSE(t, s.URL, tok, query)
	_, last := first.untilCursor(t)
	first.Close()
	old := last[:strings.LastIndexByte(last, '.')]
	if !cursor.Is(old) || strings.Count(old, ".") != 1 {
		t.Fatalf("cursor %q does not end in a fingerprint", last)
	}

	again := openSSE(t, s.URL, tok, query, "Last-Event-ID", old)
	got, cursor2 := again.untilCursor(t)
	for _, id := range tasks {
		if g := got[id]; g == nil || g.Version != 1 {
			t.Fatalf("resume without a fingerprint sent %v, want every task at v1", got)
		}
	}
	if fingerprintOf(cursor2) != fingerprintOf(last) {
		t.Fatalf("one subscription's cursors %q and %q have different fingerprints", last, cursor2)
	}
	st, ts := s.Hub().Stats(), s.Stream().Stats()
	if st.ResumeMismatches != 1 || st.Resumes != 0 || ts.Replays != 0 || ts.ResumeFallbacks[stream.FallbackCorrupt] != 0 {
		t.Fatalf("mismatches %d, resumes %d, stream replays %d, stream fallbacks %v; want 1, 0, 0 and none",
			st.ResumeMismatches, st.Resumes, ts.Replays, ts.ResumeFallbacks)
	}
}

// limitWait checks an SSE error event refusing for a limit: its wait in
// whole seconds and in milliseconds, which agree; it returns the
// milliseconds.
func limitWait(t *testing.T, ev sseEvent) time.Duration {
	t.Helper()
	var r struct {
		Code         string `json:"code"`
		Message      string `json:"message"`
		RetryAfter   *int64 `json:"retry_after"`
		RetryAfterMS int64  `json:"retry_after_ms"`
	}
	if err := json.Unmarshal([]byte(ev.Data), &r); err != nil || r.Code != hub.CodeRateLimitExceeded || r.Message == "" {
		t.Fatalf("error event %s, want code %s with a message", ev.Data, hub.CodeRateLimitExceeded)
	}
	wantWait(t, ev.Data, r.RetryAfter, r.RetryAfterMS)
	return time.Duration(r.RetryAfterMS) * time.Millisecond
}

// fingerprintOf is the subscription fingerprint ending a stream cursor.
func fingerprintOf(cursor string) string {
	// The tasks' versions a cursor may name follow the fingerprint, after
	// a comma; task ids may hold dots.
	cursor, _, _ = strings.Cut(cursor, ",")
	return cursor[strings.LastIndexByte(cursor, '.')+1:]
}

// A connection refused part of its subscription rate_limit_exceeded is asked to
// reconnect with its cursor for the rest: its cursors are versions, not a
// stream position, which would skip a refused task that never moves again.
func TestStreamRateLimitedTaskArrivesOnReconnectWithTheCursor(t *testing.T) {
	c := newCluster(t)
	cfg := c.streamConfig()
	cfg.Hub.SubscribeReads, cfg.Hub.SubscribeReadBurst = 20, 2
	s := startNode(t, cfg)
	tenant := testenv.UniqueID("tenant")
	tasks := []string{testenv.UniqueID("task"), testenv.UniqueID("task"), testenv.UniqueID("task")}
	for _, id := range tasks {
		streamPublish(t, c.redis.Client, c.redis.Names, doc(id, tenant, 1, "SUCCEEDED"))
	}
	query := "task=" + strings.Join(tasks, "&task=")
	tok := token(t, tenant, "u1")
	limited := func(ev sseEvent) bool {
		return ev.Event == "error" && strings.Contains(ev.Data, `"rate_limit_exceeded"`) && strings.Contains(ev.Data, tasks[2])
	}

	// The budget of two reads serves the URL's first two tasks.
	first := openSSE(t, s.URL, tok, query)
	last := ""
	held, refused := 0, false
	for held < 2 || !refused {
		switch ev := first.Next(t); {
		case ev.Event == "task":
			if snap := parseDoc(t, ev.Data); snap.TaskID != tasks[held] {
				t.Fatalf("got %s, want %s", snap.TaskID, tasks[held])
			}
			held++
			last = ev.ID
		case limited(ev):
			limitWait(t, ev)
			refused = true
		case ev.Event != "hello" && ev.Event != "mode":
			t.Fatalf("unexpected event %q: %s", ev.Event, ev.Data)
		}
	}
	if got := versionsCursor(t, last); len(got) != 2 || got[tasks[0]] != 1 || got[tasks[1]] != 1 {
		t.Fatalf("cursor %q of the refused connection, want the versions of the two tasks it got", last)
	}

	// Reconnect with the cursor until the budget serves the third; the
	// two the client holds are not sent again. The first connection stays
	// open, so the node's reads of those two are free (watched here) and
	// the budget goes to the third.
	deadline := time.Now().Add(waitFor)
	for {
		if time.Now().After(deadline) {
			t.Fatalf("%s still refused after %v", tasks[2], waitFor)
		}
		again := openSSE(t, s.URL, tok, query, "Last-Event-ID", last)
		ev := again.Next(t)
		for ev.Event == "hello" || ev.Event == "mode" {
			ev = again.Next(t)
		}
		if limited(ev) {
			// As a client does: come back after retry_after_ms.
			wait := limitWait(t, ev)
			again.Close()
			time.Sleep(wait)
			continue
		}
		if ev.Event != "task" {
			t.Fatalf("unexpected event %q: %s", ev.Event, ev.Data)
		}
		if snap := parseDoc(t, ev.Data); snap.TaskID != tasks[2] || snap.Version != 1 {
			t.Fatalf("got %s v%d, want %s v1 alone", snap.TaskID, snap.Version, tasks[2])
		}
		// Served whole, the connection has a stream cursor again.
		if !cursor.Is(ev.ID) {
			if got, _ := again.untilCursor(t); len(got) != 0 {
				t.Fatalf("after %s, got %v, want nothing more", tasks[2], got)
			}
		}
		break
	}
}
