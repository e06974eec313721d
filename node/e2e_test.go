package node_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/pushd/pushd/fanout"
	"github.com/pushd/pushd/internal/testenv"
	"github.com/pushd/pushd/node"
	"github.com/pushd/pushd/snapshot"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// cluster is the shared Redis (a prefix of this test's own), the package's
// database, and nodes configured against both.
type cluster struct {
	redis testenv.Redis
	pg    testenv.Postgres
}

func newCluster(t *testing.T) *cluster {
	return &cluster{redis: testenv.SharedRedis(t), pg: testenv.Database(t)}
}

func (c *cluster) config() node.Config {
	return node.Config{RedisURL: c.redis.URL, KeyPrefix: c.redis.Names.Prefix, DatabaseURL: c.pg.URL}
}

// tssWrite is what a Task State Service does without our publisher: SET the
// snapshot, then PUBLISH a hint.
func (c *cluster) tssWrite(t *testing.T, d string) {
	t.Helper()
	s := parseDoc(t, d)
	ctx := context.Background()
	if err := c.redis.Client.Set(ctx, c.redis.Names.Snapshot(s.TaskID), d, time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	c.tssPublish(t, s.TenantID, fmt.Sprintf(`{"task_id":%q,"version":%d,"status":%q}`, s.TaskID, s.Version, s.Status))
}

func (c *cluster) tssPublish(t *testing.T, tenant, payload string) {
	t.Helper()
	if err := c.redis.Client.Publish(context.Background(), c.redis.Names.Channel(tenant), payload).Err(); err != nil {
		t.Fatal(err)
	}
}

func (c *cluster) goPublish(t *testing.T, d string) {
	t.Helper()
	pub := fanout.NewRedisPublisher(c.redis.Client, c.redis.Names)
	if _, err := pub.Publish(context.Background(), parseDoc(t, d)); err != nil {
		t.Fatal(err)
	}
}

func httpPublish(t *testing.T, base, d string) {
	t.Helper()
	resp, body := httpDo(t, http.MethodPost, base+"/v1/publish", "", d)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("publish: %d %s", resp.StatusCode, body)
	}
}

func TestSSEAndWebSocketSeeEveryVersionPublishedThreeWays(t *testing.T) {
	c := newCluster(t)
	s := startNode(t, c.config())
	task := testenv.UniqueID("task")
	c.goPublish(t, doc(task, "t1", 1, "QUEUED"))

	sse := openSSE(t, s.URL, token(t, "t1", "u1"), "task="+task)
	ws := openWS(t, s.URL, token(t, "t1", "u1"))
	ws.send(t, map[string]any{"op": "subscribe", "id": 1, "tasks": []string{task}})

	hello := sse.Next(t)
	if hello.Event != "hello" || hello.Retry < 2000 || hello.Retry > 3000 {
		t.Fatalf("first SSE event %+v, want hello with retry in [2000,3000]", hello)
	}
	var h struct{ ConnID, Node, Mode string }
	json.Unmarshal([]byte(strings.ReplaceAll(hello.Data, "conn_id", "connid")), &h)
	if h.Mode != "push" || h.Node == "" {
		t.Fatalf("hello %s", hello.Data)
	}
	first := sse.NextOf(t, "task")
	if snap := parseDoc(t, first.Data); snap.Version != 1 || first.ID == "" {
		t.Fatalf("initial SSE event %+v", first)
	}
	if !strings.Contains(first.Data, `"x_custom":{"kept":true}`) {
		t.Fatalf("unknown fields not forwarded: %s", first.Data)
	}
	if got := ws.nextTask(t); got.Version != 1 {
		t.Fatalf("initial WS version %d", got.Version)
	}
	ack := ws.NextOf(t, "ack")
	if string(ack["id"]) != "1" || string(ack["rejected"]) != "[]" {
		t.Fatalf("ack %s", rawString(ack))
	}

	publishers := []func(string){
		func(d string) { c.tssWrite(t, d) },
		func(d string) { c.goPublish(t, d) },
		func(d string) { httpPublish(t, s.URL, d) },
	}
	for i, publish := range publishers {
		v := int64(i + 2)
		publish(doc(task, "t1", v, "RUNNING"))
		if got := sse.nextTask(t); got.Version != v {
			t.Fatalf("publisher %d: SSE got version %d, want %d", i, got.Version, v)
		}
		if got := ws.nextTask(t); got.Version != v {
			t.Fatalf("publisher %d: WS got version %d, want %d", i, got.Version, v)
		}
	}
}

func TestOlderVersionIsNeverDelivered(t *testing.T) {
	c := newCluster(t)
	s := startNode(t, c.config())
	task := testenv.UniqueID("task")
	c.goPublish(t, doc(task, "t1", 5, "RUNNING"))
	sse := openSSE(t, s.URL, token(t, "t1", "u1"), "task="+task)
	ws := openWS(t, s.URL, token(t, "t1", "u1"))
	ws.send(t, map[string]any{"op": "subscribe", "id": 1, "tasks": []string{task}})
	if v := sse.nextTask(t).Version; v != 5 {
		t.Fatalf("initial %d", v)
	}
	if v := ws.nextTask(t).Version; v != 5 {
		t.Fatalf("initial %d", v)
	}
	ws.NextOf(t, "ack")
	// A misbehaving writer overwrites Redis with an older version and
	// announces it; then the real next version comes.
	c.tssWrite(t, doc(task, "t1", 3, "RUNNING"))
	c.tssPublish(t, "t1", fmt.Sprintf(`{"task_id":%q,"version":4}`, task))
	c.goPublish(t, doc(task, "t1", 6, "RUNNING"))
	c.tssPublish(t, "t1", fmt.Sprintf(`{"task_id":%q,"version":6}`, task))
	if v := sse.nextTask(t).Version; v != 6 {
		t.Fatalf("SSE got version %d after 5, want 6", v)
	}
	if v := ws.nextTask(t).Version; v != 6 {
		t.Fatalf("WS got version %d after 5, want 6", v)
	}
}

func TestMissingFromRedisIsReadFromPostgresAndWrittenBack(t *testing.T) {
	c := newCluster(t)
	s := startNode(t, c.config())
	task := testenv.UniqueID("task")
	c.pg.InsertTask(t, testenv.Task{ID: task, TenantID: "t1", ProjectID: "p1", UserID: "u1", Status: "SUCCEEDED", Progress: 100, Version: 9})

	sse := openSSE(t, s.URL, token(t, "t1", "u1"), "task="+task)
	got := sse.nextTask(t)
	if got.Version != 9 || got.Status != "SUCCEEDED" {
		t.Fatalf("got %s v%d", got.Status, got.Version)
	}
	ctx := context.Background()
	key := c.redis.Names.Snapshot(task)
	stored, err := c.redis.Client.Get(ctx, key).Result()
	if err != nil {
		t.Fatalf("snapshot not written back to Redis: %v", err)
	}
	if parseDoc(t, stored).Version != 9 {
		t.Fatalf("written back %s", stored)
	}
	ttl := c.redis.Client.PTTL(ctx, key).Val()
	if want := snapshot.TTL("SUCCEEDED"); ttl < want-time.Minute || ttl > want+want/10 {
		t.Fatalf("write-back TTL %v, want about %v (SUCCEEDED) plus jitter", ttl, want)
	}
}

func TestManyWatchersCostOneReadPerNotification(t *testing.T) {
	c := newCluster(t)
	s := startNode(t, c.config())
	store := s.Store()
	task := testenv.UniqueID("task")
	c.pg.InsertTask(t, testenv.Task{ID: task, TenantID: "t1", ProjectID: "p1", UserID: "u1", Status: "RUNNING", Version: 1})

	const n = 200
	tok := token(t, "t1", "u1")
	clients := make([]*sseClient, n)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var failed []string
	for i := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cl := openSSE(t, s.URL, tok, "task="+task)
			mu.Lock()
			defer mu.Unlock()
			if cl.Status != http.StatusOK {
				failed = append(failed, cl.Body)
			}
			clients[i] = cl
		}()
	}
	wg.Wait()
	if len(failed) > 0 {
		t.Fatalf("%d connections refused: %s", len(failed), failed[0])
	}
	for _, cl := range clients {
		if v := cl.nextTask(t).Version; v != 1 {
			t.Fatalf("initial version %d", v)
		}
	}
	if q := store.Stats().DBQueries; q > 1 {
		t.Fatalf("%d PostgreSQL queries for a cold miss watched by %d connections, want at most 1", q, n)
	}

	reads := store.Stats().RedisReads
	c.goPublish(t, doc(task, "t1", 2, "RUNNING"))
	for _, cl := range clients {
		if v := cl.nextTask(t).Version; v != 2 {
			t.Fatalf("version %d, want 2", v)
		}
	}
	if d := store.Stats().RedisReads - reads; d != 1 {
		t.Fatalf("%d Redis reads for one notification to %d connections, want 1", d, n)
	}
}

func TestPublishReachesWatchersOnTwoNodes(t *testing.T) {
	c := newCluster(t)
	a := startNode(t, c.config())
	b := startNode(t, c.config())
	task := testenv.UniqueID("task")
	c.goPublish(t, doc(task, "t1", 1, "QUEUED"))
	onA := openSSE(t, a.URL, token(t, "t1", "u1"), "task="+task)
	onB := openWS(t, b.URL, token(t, "t1", "u1"))
	onB.send(t, map[string]any{"op": "subscribe", "id": 7, "tasks": []string{task}})
	onA.nextTask(t)
	onB.nextTask(t)
	onB.NextOf(t, "ack")

	httpPublish(t, a.URL, doc(task, "t1", 2, "RUNNING")) // through node A's API
	if v := onA.nextTask(t).Version; v != 2 {
		t.Fatalf("node A delivered %d", v)
	}
	if v := onB.nextTask(t).Version; v != 2 {
		t.Fatalf("node B delivered %d", v)
	}
}

func TestOtherTenantsTaskLooksAbsent(t *testing.T) {
	c := newCluster(t)
	s := startNode(t, c.config())
	theirs := testenv.UniqueID("task")
	absent := testenv.UniqueID("task")
	mine := testenv.UniqueID("task")
	c.goPublish(t, doc(theirs, "tB", 1, "RUNNING"))
	tokA := token(t, "tA", "u1")

	// HTTP: identical answers for B's task and an absent one.
	r1, b1 := httpDo(t, http.MethodGet, s.URL+"/v1/tasks/"+theirs, tokA, "")
	r2, b2 := httpDo(t, http.MethodGet, s.URL+"/v1/tasks/"+absent, tokA, "")
	wantError(t, r1, b1, http.StatusNotFound, "not_found")
	if string(b1) != strings.ReplaceAll(string(b2), absent, theirs) || r1.StatusCode != r2.StatusCode {
		t.Fatalf("another tenant's task answered %d %s, an absent one %d %s", r1.StatusCode, b1, r2.StatusCode, b2)
	}
	resp, body := httpDo(t, http.MethodGet, s.URL+"/v1/tasks?ids="+theirs+","+absent, tokA, "")
	if resp.StatusCode != http.StatusOK || strings.Contains(string(body), `"tenant_id":"tB"`) {
		t.Fatalf("batch read: %d %s", resp.StatusCode, body)
	}

	// SSE and WS: both refusals read not_found, and nothing of B's arrives
	// whatever is published where.
	c.goPublish(t, doc(mine, "tA", 1, "RUNNING"))
	sse := openSSE(t, s.URL, tokA, "task="+theirs+"&task="+absent+"&task="+mine)
	var codes []string
	sawMine := false
	for len(codes) < 2 || !sawMine {
		ev := sse.Next(t)
		switch ev.Event {
		case "error":
			var e struct{ Code string }
			json.Unmarshal([]byte(ev.Data), &e)
			codes = append(codes, e.Code)
		case "task":
			if got := parseDoc(t, ev.Data); got.TaskID != mine {
				t.Fatalf("tenant A's SSE received %s", got.TaskID)
			}
			sawMine = true
		}
	}
	if codes[0] != "not_found" || codes[1] != "not_found" {
		t.Fatalf("SSE refusals %v", codes)
	}
	ws := openWS(t, s.URL, tokA)
	ws.send(t, map[string]any{"op": "subscribe", "id": 1, "tasks": []string{theirs, absent, mine}})
	if got := ws.nextTask(t); got.TaskID != mine {
		t.Fatalf("tenant A's WS received %s", got.TaskID)
	}
	ack := ws.NextOf(t, "ack")
	var rej []struct{ Code string }
	json.Unmarshal(ack["rejected"], &rej)
	if len(rej) != 2 || rej[0].Code != "not_found" || rej[1].Code != "not_found" {
		t.Fatalf("WS rejections %s", ack["rejected"])
	}

	c.goPublish(t, doc(theirs, "tB", 2, "RUNNING"))
	c.tssPublish(t, "tA", fmt.Sprintf(`{"task_id":%q,"version":3}`, theirs))
	c.tssWrite(t, doc(theirs, "tB", 3, "RUNNING"))
	c.tssPublish(t, "tA", fmt.Sprintf(`{"task_id":%q,"version":3}`, theirs))
	c.goPublish(t, doc(mine, "tA", 2, "RUNNING")) // a marker behind B's changes
	if got := sse.nextTask(t); got.TaskID != mine || got.Version != 2 {
		t.Fatalf("tenant A's SSE received %s of tenant %s", got.TaskID, got.TenantID)
	}
	if got := ws.nextTask(t); got.TaskID != mine || got.Version != 2 {
		t.Fatalf("tenant A's WS received %s of tenant %s", got.TaskID, got.TenantID)
	}
}

func TestBadInputGetsClearErrors(t *testing.T) {
	c := newCluster(t)
	s := startNode(t, c.config())
	task := testenv.UniqueID("task")
	c.goPublish(t, doc(task, "t1", 1, "RUNNING"))
	tok := token(t, "t1", "u1")
	watcher := openSSE(t, s.URL, tok, "task="+task)
	watcher.nextTask(t)

	t.Run("http", func(t *testing.T) {
		cases := []struct {
			name, method, path, tok, body string
			status                        int
			code                          string
		}{
			{"malformed id", "GET", "/v1/tasks/bad%7Bid%7D", tok, "", 400, "invalid_id"},
			{"too long id", "GET", "/v1/tasks/" + strings.Repeat("a", 200), tok, "", 400, "invalid_id"},
			{"unknown parameter", "GET", "/v1/tasks/" + task + "?verbose=1", tok, "", 400, "unknown_parameter"},
			{"too many ids", "GET", "/v1/tasks?ids=" + strings.Repeat("a,", 100) + "a", tok, "", 400, "too_many_ids"},
			{"no ids", "GET", "/v1/tasks", tok, "", 400, "bad_request"},
			{"sse malformed id", "GET", "/v1/events?task=a%20b", tok, "", 400, "invalid_id"},
			{"sse unknown parameter", "GET", "/v1/events?task=a&foo=1", tok, "", 400, "unknown_parameter"},
			{"sse nothing to watch", "GET", "/v1/events", tok, "", 400, "bad_request"},
			{"sse bad scope", "GET", "/v1/events?scope=all", tok, "", 400, "bad_request"},
			{"sse too many tasks", "GET", "/v1/events?task=a" + strings.Repeat("&task=a", 100), tok, "", 400, "too_many_ids"},
			{"url too long", "GET", "/v1/tasks/" + task + "?x=" + strings.Repeat("a", 9<<10), tok, "", 414, "uri_too_long"},
			{"missing token", "GET", "/v1/events?task=a", "", "", 401, "unauthorized"},
			{"expired token", "GET", "/v1/events?task=a", tokenExp(t, "t1", "u1", time.Now().Add(-time.Hour)), "", 401, "token_expired"},
			{"wrong signature", "GET", "/v1/tasks/" + task, tok[:len(tok)-4] + "AAAA", "", 401, "unauthorized"},
			{"alg none", "GET", "/v1/tasks/" + task, algNone(t), "", 401, "unauthorized"},
			{"garbage token", "GET", "/v1/tasks/" + task, "not.a.jwt", "", 401, "unauthorized"},
			{"publish invalid snapshot", "POST", "/v1/publish", "", `{"task_id":"x"}`, 400, "invalid_snapshot"},
			{"publish not json", "POST", "/v1/publish", "", `{{{`, 400, "invalid_snapshot"},
			{"publish oversized", "POST", "/v1/publish", "", `{"pad":"` + strings.Repeat("x", 70<<10) + `"}`, 413, "too_large"},
			{"unknown route", "GET", "/v2/nothing", tok, "", 404, "not_found"},
			{"wrong method", "DELETE", "/v1/publish", tok, "", 405, "method_not_allowed"},
		}
		for _, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				resp, body := httpDo(t, tc.method, s.URL+tc.path, tc.tok, tc.body)
				wantError(t, resp, body, tc.status, tc.code)
			})
		}
	})

	t.Run("websocket", func(t *testing.T) {
		ws := openWS(t, s.URL, tok)
		ws.sendRaw(t, websocket.MessageText, []byte(`{not json`))
		if e := ws.NextOf(t, "error"); !strings.Contains(string(e["code"]), "bad_request") {
			t.Fatalf("error %s", rawString(e))
		}
		ws.send(t, map[string]any{"op": "subscribe", "id": 1, "tasks": []string{"bad id"}})
		ws.NextOf(t, "error")
		ws.send(t, map[string]any{"op": "dance", "id": 2})
		ws.NextOf(t, "error")
		ws.send(t, map[string]any{"op": "subscribe", "id": 3, "tasks": []string{task}, "extra": true})
		ws.NextOf(t, "error")
		// An invalid id in since refuses the request whole, as anywhere
		// else: the task is not watched, so the next subscribe reads it.
		ws.send(t, map[string]any{"op": "subscribe", "id": 3, "tasks": []string{task}, "since": map[string]int64{"a b": 1}})
		if e := ws.NextOf(t, "error"); !strings.Contains(string(e["code"]), "bad_request") || !strings.Contains(string(e["message"]), "since") {
			t.Fatalf("an invalid id in since answered %s, want bad_request naming since", rawString(e))
		}
		// The connection still works after bad requests.
		ws.send(t, map[string]any{"op": "subscribe", "id": 4, "tasks": []string{task}})
		if v := ws.nextTask(t).Version; v != 1 {
			t.Fatalf("version %d", v)
		}
		ws.NextOf(t, "ack")

		// The server stops reading at the limit and closes with 1009. It may
		// close while the client is still writing the rest, in which case
		// the client's write fails and the reset can overtake the close
		// frame: either way the connection is ended, and never served.
		big := openWS(t, s.URL, tok)
		wctx, wcancel := context.WithTimeout(context.Background(), waitFor)
		werr := big.conn.Write(wctx, websocket.MessageText, []byte(`{"op":"subscribe","tasks":["`+strings.Repeat("a", 70<<10)+`"]}`))
		wcancel()
		if code := big.closeStatus(t); code != websocket.StatusMessageTooBig && werr == nil {
			t.Fatalf("oversized message closed with %d, want 1009", code)
		}
		bin := openWS(t, s.URL, tok)
		bin.sendRaw(t, websocket.MessageBinary, []byte{1, 2, 3})
		if code := bin.closeStatus(t); code != websocket.StatusUnsupportedData {
			t.Fatalf("binary message closed with %d, want 1003", code)
		}
		spam := openWS(t, s.URL, tok)
		for range 10 {
			spam.sendRaw(t, websocket.MessageText, []byte(`[]`))
		}
		if code := spam.closeStatus(t); code != websocket.StatusPolicyViolation {
			t.Fatalf("a flood of bad requests closed with %d, want 1008", code)
		}

		_, resp, err := dialWS(t, s.URL, "", nil)
		if err == nil || resp == nil || resp.StatusCode != http.StatusUnauthorized {
			t.Fatalf("WS without a token: %v %v", err, resp)
		}
		_, resp, err = dialWS(t, s.URL, tok, &websocket.DialOptions{
			Subprotocols: []string{"pushd.v1"}, HTTPHeader: http.Header{"Origin": {"https://evil.example"}},
		})
		if err == nil || resp == nil || resp.StatusCode != http.StatusForbidden {
			t.Fatalf("WS from a foreign origin: %v %v", err, resp)
		}
		noproto, _, err := dialWS(t, s.URL, tok, &websocket.DialOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if code := noproto.closeStatus(t); code != websocket.StatusPolicyViolation {
			t.Fatalf("WS without the subprotocol closed with %d, want 1008", code)
		}
	})

	t.Run("pubsub garbage", func(t *testing.T) {
		for _, p := range []string{`garbage`, `{}`, `{"task_id":"` + task + `"}`, `{"task_id":"a b","version":2}`, `{"task_id":"` + task + `","version":"x"}`, `[]`, strings.Repeat("x", 10<<10)} {
			c.tssPublish(t, "t1", p)
		}
		c.goPublish(t, doc(task, "t1", 2, "RUNNING"))
	})
	// Through all of the above, the first watcher kept being served.
	if v := watcher.nextTask(t).Version; v != 2 {
		t.Fatalf("the watcher got version %d, want 2", v)
	}
}

// algNone is a token with "alg":"none" and no signature.
func algNone(t *testing.T) string {
	t.Helper()
	enc := func(s string) string {
		return strings.TrimRight(base64URL([]byte(s)), "=")
	}
	exp := time.Now().Add(time.Hour).Unix()
	return enc(`{"alg":"none","typ":"JWT"}`) + "." + enc(fmt.Sprintf(`{"sub":"u1","tenant_id":"t1","exp":%d}`, exp)) + "."
}

func TestResumeSkipsTasksThatDidNotMove(t *testing.T) {
	c := newCluster(t)
	s := startNode(t, c.config())
	a, b := testenv.UniqueID("task"), testenv.UniqueID("task")
	c.goPublish(t, doc(a, "t1", 1, "RUNNING"))
	c.goPublish(t, doc(b, "t1", 1, "RUNNING"))
	tok := token(t, "t1", "u1")
	first := openSSE(t, s.URL, tok, "task="+a+"&task="+b)
	first.NextOf(t, "task")
	last := first.NextOf(t, "task")
	first.Close()

	c.goPublish(t, doc(b, "t1", 2, "RUNNING"))
	again := openSSE(t, s.URL, tok, "task="+a+"&task="+b, "Last-Event-ID", last.ID)
	got := again.nextTask(t)
	if got.TaskID != b || got.Version != 2 {
		t.Fatalf("after resume got %s v%d, want only %s v2", got.TaskID, got.Version, b)
	}
}

// A stream ends when the node stops honouring its token: at exp plus the
// clock leeway (5 s) its admission allowed, so a token admitted inside the
// leeway is not cut at once, and is cut then.
func TestTokenExpiryEndsStream(t *testing.T) {
	c := newCluster(t)
	cfg := c.config()
	cfg.Hub.HeartbeatInterval = 100 * time.Millisecond // the expiry check runs on the heartbeat tick
	s := startNode(t, cfg)
	exp := time.Now().Add(-2 * time.Second).Truncate(time.Second) // a JWT's exp is in whole seconds
	sse := openSSE(t, s.URL, tokenExp(t, "t1", "u1", exp), "task=x1")
	if sse.Status != http.StatusOK {
		t.Fatalf("a token inside the leeway: %d %s, want a stream", sse.Status, sse.Body)
	}
	ends := exp.Add(5 * time.Second)
	if at := sse.expiredAt(t, "SSE", ends.Add(waitFor)); at.Before(ends) {
		t.Fatalf("token_expired at %s, before exp plus the leeway (%s)", at.Format(time.RFC3339Nano), ends.Format(time.RFC3339Nano))
	}
	sse.Ended(t)
}

func TestDisconnectedClientsLeaveNothingBehind(t *testing.T) {
	c := newCluster(t)
	s := startNode(t, c.config())
	task := testenv.UniqueID("task")
	c.goPublish(t, doc(task, "t1", 1, "RUNNING"))
	base := runtime.NumGoroutine()
	tok := token(t, "t1", "u1")
	var sses []*sseClient
	var wss []*wsClient
	for range 20 {
		cl := openSSE(t, s.URL, tok, "task="+task)
		cl.nextTask(t)
		sses = append(sses, cl)
		w := openWS(t, s.URL, tok)
		w.send(t, map[string]any{"op": "subscribe", "id": 1, "tasks": []string{task}})
		w.nextTask(t)
		wss = append(wss, w)
	}
	if n := s.Hub().Len(); n != 40 {
		t.Fatalf("hub holds %d connections, want 40", n)
	}
	for i := range sses {
		sses[i].Close()
		wss[i].Close()
	}
	testenv.Eventually(t, "every connection and its goroutines gone after the disconnects", func() bool {
		return s.Hub().Len() == 0 && runtime.NumGoroutine() <= base+5
	})
	http.DefaultClient.CloseIdleConnections()
}
