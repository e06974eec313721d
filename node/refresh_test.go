package node_test

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/pushd/pushd/admission"
	"github.com/pushd/pushd/internal/testenv"
	"github.com/pushd/pushd/node"
	"github.com/pushd/pushd/ws"
)

// A WebSocket connection refreshed with a new token outlives the first
// token's exp, while a connection of the same token that was not refreshed
// ends at it; the refreshed token's grant applies from then on.
func TestWebSocketRefreshOutlivesTheFirstToken(t *testing.T) {
	c := newCluster(t)
	cfg := c.config()
	cfg.Hub.HeartbeatInterval = 200 * time.Millisecond // the expiry check runs on the heartbeat tick
	srv := startNode(t, cfg)
	f := newGrantFixture(t, c)
	short := tokenExp(t, f.tenant, "u1", time.Now().Add(3*time.Second))
	open := func() *wsClient {
		cl := openWS(t, srv.URL, short)
		cl.send(t, map[string]any{"op": "subscribe", "id": 1, "tasks": []string{f.p1, f.p2}})
		untilVersions(t, taskClient{"WebSocket", cl.nextTask}, map[string]int64{f.p1: 1, f.p2: 1})
		cl.NextOf(t, "ack")
		return cl
	}
	refreshed, control := open(), open()
	// The new token sees P1 and the user's own tasks, no longer P2.
	refreshed.send(t, map[string]any{"op": "refresh", "id": 2, "token": tokenFor(t, f.tenant, "P1")})
	if ack := refreshed.NextOf(t, "ack"); string(ack["id"]) != "2" {
		t.Fatalf("refresh answered %s, want the ack of id 2", rawString(ack))
	}
	if code := control.closeStatus(t); code != ws.StatusTokenExpired {
		t.Fatalf("the connection not refreshed closed with %d, want %d at its token's exp", code, ws.StatusTokenExpired)
	}
	c.goPublish(t, scopedDoc(f.p2, f.tenant, "P2", "u2", 2))
	c.goPublish(t, scopedDoc(f.p1, f.tenant, "P1", "u2", 2))
	if s := refreshed.nextTask(t); s.TaskID != f.p1 || s.Version != 2 {
		t.Fatalf("the refreshed connection got %s v%d after the first token's exp, want %s v2 (and nothing of P2)", s.TaskID, s.Version, f.p1)
	}
	if st := srv.Hub().Stats(); st.Refreshes != 1 {
		t.Fatalf("%d refreshes counted, want 1", st.Refreshes)
	}
}

// A refresh whose token is another user's, another tenant's, expired or
// invalid is refused: an error saying so, then close 4003.
func TestWebSocketRefreshRefusesAnotherPrincipal(t *testing.T) {
	c := newCluster(t)
	srv := startNode(t, c.config())
	tenant := testenv.UniqueID("t")
	for _, tc := range []struct {
		name, token, code string
	}{
		{"another user", token(t, tenant, "u2"), "unauthorized"},
		{"another tenant", token(t, testenv.UniqueID("t"), "u1"), "unauthorized"},
		{"expired", tokenExp(t, tenant, "u1", time.Now().Add(-time.Hour)), "token_expired"},
		{"invalid", "not.a.token", "unauthorized"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cl := openWS(t, srv.URL, token(t, tenant, "u1"))
			cl.send(t, map[string]any{"op": "refresh", "id": 1, "token": tc.token})
			m := cl.NextOf(t, "error")
			var code string
			json.Unmarshal(m["code"], &code)
			if code != tc.code {
				t.Fatalf("refresh refused with %s, want code %s", rawString(m), tc.code)
			}
			if got := cl.closeStatus(t); got != websocket.StatusCode(ws.StatusTokenRefused) {
				t.Fatalf("closed with %d, want %d", got, ws.StatusTokenRefused)
			}
		})
	}
}

// A WebSocket answers to the credential it holds now: refreshed with a
// session token, that session's logout ends it within the re-check
// interval, however long the token it opened with lives; refreshed away
// from a session, that session's logout no longer does. A refresh with a
// session already logged out is refused.
func TestWebSocketRefreshHandsTheLogoutCheckToTheNewToken(t *testing.T) {
	c := newCluster(t)
	cfg := c.config()
	cfg.Admission = admission.Config{SessionCheckInterval: 200 * time.Millisecond, MaxConnsPerUser: 100}
	cfg.Hub.HeartbeatInterval = 200 * time.Millisecond // the hub ends revoked connections on its tick
	srv := startNode(t, cfg)
	ctx := context.Background()
	tenant := testenv.UniqueID("t")
	session := func(t *testing.T) string {
		tok := sessionToken()
		if err := c.redis.Client.Set(ctx, c.redis.Names.Prefix+"session:"+tok, `{"tenant_id":"`+tenant+`","user_id":"u1"}`, time.Hour).Err(); err != nil {
			t.Fatal(err)
		}
		return tok
	}
	logout := func(t *testing.T, tok string) {
		if err := c.redis.Client.Del(ctx, c.redis.Names.Prefix+"session:"+tok).Err(); err != nil {
			t.Fatal(err)
		}
	}
	refresh := func(t *testing.T, cl *wsClient, tok string) {
		cl.send(t, map[string]any{"op": "refresh", "id": 2, "token": tok})
		if ack := cl.NextOf(t, "ack"); string(ack["id"]) != "2" {
			t.Fatalf("refresh answered %s, want the ack of id 2", rawString(ack))
		}
	}
	open := func(t *testing.T, tok, task string) *wsClient {
		cl := openWS(t, srv.URL, tok)
		cl.send(t, map[string]any{"op": "subscribe", "id": 1, "tasks": []string{task}})
		cl.NextOf(t, "ack") // the task rejected not_found: it is not there yet
		return cl
	}
	// twoChecks waits for two whole re-check rounds: one may have started
	// before the logout.
	twoChecks := func(t *testing.T) {
		checks := srv.Admission().Stats().SessionChecks
		testenv.Eventually(t, "two session re-checks", func() bool { return srv.Admission().Stats().SessionChecks >= checks+2 })
	}
	stillServed := func(t *testing.T, cl *wsClient, task string, v int64) {
		c.goPublish(t, doc(task, tenant, v, "RUNNING"))
		if s := cl.nextTask(t); s.TaskID != task || s.Version != v {
			t.Fatalf("got %s v%d, want %s v%d: the connection should still be served", s.TaskID, s.Version, task, v)
		}
	}

	t.Run("from a JWT to a session", func(t *testing.T) {
		task := testenv.UniqueID("task")
		cl := open(t, tokenExp(t, tenant, "u1", time.Now().Add(time.Hour)), task)
		s := session(t)
		refresh(t, cl, s)
		logout(t, s)
		if code := cl.closeStatus(t); code != ws.StatusTokenExpired {
			t.Fatalf("closed with %d after the refresh's session was logged out, want %d", code, ws.StatusTokenExpired)
		}
	})
	t.Run("from a session to another", func(t *testing.T) {
		task := testenv.UniqueID("task")
		first, second := session(t), session(t)
		cl := open(t, first, task)
		refresh(t, cl, second)
		logout(t, first)
		twoChecks(t)
		stillServed(t, cl, task, 1)
		logout(t, second)
		if code := cl.closeStatus(t); code != ws.StatusTokenExpired {
			t.Fatalf("closed with %d after the refresh's session was logged out, want %d", code, ws.StatusTokenExpired)
		}
	})
	t.Run("from a session to a JWT", func(t *testing.T) {
		task := testenv.UniqueID("task")
		first := session(t)
		cl := open(t, first, task)
		refresh(t, cl, token(t, tenant, "u1"))
		logout(t, first)
		twoChecks(t)
		stillServed(t, cl, task, 1)
	})
	t.Run("to a session logged out", func(t *testing.T) {
		cl := open(t, token(t, tenant, "u1"), testenv.UniqueID("task"))
		s := session(t)
		logout(t, s)
		cl.send(t, map[string]any{"op": "refresh", "id": 2, "token": s})
		if m := cl.NextOf(t, "error"); !strings.Contains(string(m["code"]), "unauthorized") {
			t.Fatalf("a refresh with a logged-out session answered %s, want unauthorized", rawString(m))
		}
		if code := cl.closeStatus(t); code != websocket.StatusCode(ws.StatusTokenRefused) {
			t.Fatalf("closed with %d, want %d", code, ws.StatusTokenRefused)
		}
	})
}

// A refresh counts against its connection's address as a request's token
// does: with the sessions table gone, refreshes with session tokens are
// answered unavailable (the connection goes on) only until the address's
// failed-authentication bucket is spent, then rate_limit_exceeded, and
// PostgreSQL sees no more lookups than the burst; the address's plain
// requests are refused with 429 too.
func TestWebSocketRefreshCountsFailedAuthentications(t *testing.T) {
	pg := ownDatabase(t) // its own: the test drops a table
	if _, err := pg.Pool.Exec(context.Background(), `DROP TABLE sessions`); err != nil {
		t.Fatal(err)
	}
	app := "pushd_refresh_" + testenv.RandomSuffix(4)
	r := testenv.SharedRedis(t)
	cfg := node.Config{RedisURL: r.URL, KeyPrefix: r.Names.Prefix, DatabaseURL: pg.AppURL(app)}
	const burst = 3
	cfg.API.AuthFailureBurst, cfg.API.AuthFailureRate = burst, 0.01
	srv := startNode(t, cfg)
	before := rollbacks(t, pg)

	tenant := testenv.UniqueID("t")
	cl := openWS(t, srv.URL, token(t, tenant, "u1")) // a JWT: its check costs no lookup
	const refreshes = 10
	codes := map[string]int{}
	for i := range refreshes {
		cl.send(t, map[string]any{"op": "refresh", "id": i, "token": sessionToken()})
		m := cl.NextOf(t, "error")
		var code string
		var ms int64
		json.Unmarshal(m["code"], &code)
		json.Unmarshal(m["retry_after_ms"], &ms)
		codes[code]++
		if code == "rate_limit_exceeded" && ms <= 0 {
			t.Fatalf("refresh %d refused with %s, want a retry_after_ms", i, rawString(m))
		}
	}
	pg.FlushStats(t, app)
	lookups := rollbacks(t, pg) - before
	t.Logf("%d refreshes with session tokens, the sessions table missing: %v; %d failed lookups in PostgreSQL", refreshes, codes, lookups)
	if codes["unavailable"] != burst || codes["rate_limit_exceeded"] != refreshes-burst {
		t.Fatalf("refreshes answered %v, want %d unavailable and the rest rate_limit_exceeded", codes, burst)
	}
	if lookups > burst {
		t.Fatalf("%d failed session lookups, want at most %d", lookups, burst)
	}
	// The connection goes on, and the address's requests are refused too.
	cl.send(t, map[string]any{"op": "subscribe", "id": 99})
	cl.NextOf(t, "ack")
	resp, body := httpDo(t, http.MethodGet, srv.URL+"/v1/tasks/task_absent", sessionToken(), "")
	wantError(t, resp, body, http.StatusTooManyRequests, "rate_limit_exceeded")
}
