package node_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/pushd/pushd/admission"
	"github.com/pushd/pushd/internal/testenv"
	pushdws "github.com/pushd/pushd/ws"
)

// sessionToken returns a fresh opaque session token (no dots: not a JWT).
func sessionToken() string { return "sess_" + testenv.RandomSuffix(16) }

func TestSessionTokens(t *testing.T) {
	c := newCluster(t)
	cfg := c.config()
	cfg.Admission = admission.Config{SessionCheckInterval: 100 * time.Millisecond, MaxConnsPerUser: 10}
	srv := startNode(t, cfg)
	ctx := context.Background()
	tenant, user := testenv.UniqueID("tenant"), testenv.UniqueID("user")
	inRedis := sessionToken()
	sessKey := func(tok string) string { return c.redis.Names.Prefix + "session:" + tok }
	if err := c.redis.Client.Set(ctx, sessKey(inRedis), `{"tenant_id":"`+tenant+`","user_id":"`+user+`","plan":"pro"}`, time.Hour).Err(); err != nil {
		t.Fatal(err)
	}

	// A session token works over both transports and the HTTP API.
	sc := openSSE(t, srv.URL, inRedis, "task=task_s1")
	if sc.Status != http.StatusOK {
		t.Fatalf("SSE with a session: %d %s", sc.Status, sc.Body)
	}
	ws := openWS(t, srv.URL, inRedis)
	if resp, body := httpDo(t, http.MethodGet, srv.URL+"/v1/tasks/task_s1", inRedis, ""); resp.StatusCode != http.StatusNotFound {
		t.Fatalf("GET with a session: %d %s", resp.StatusCode, body)
	}
	// An unknown session is refused like a bad token.
	resp, body := httpDo(t, http.MethodGet, srv.URL+"/v1/tasks/task_s1", sessionToken(), "")
	wantError(t, resp, body, http.StatusUnauthorized, "unauthorized")

	// Deleting the session closes its connections with the token-expired
	// reason, on both transports.
	c.redis.Client.Del(ctx, sessKey(inRedis))
	for {
		ev := sc.Next(t)
		if ev.Event == "error" && strings.Contains(ev.Data, `"token_expired"`) {
			break
		}
	}
	sc.Ended(t)
	if code := ws.closeStatus(t); code != pushdws.StatusTokenExpired {
		t.Fatalf("WebSocket closed with %d, want the token-expired close", code)
	}
	if srv.Admission().Stats().SessionsClosed != 1 {
		t.Fatalf("sessions closed: %d", srv.Admission().Stats().SessionsClosed)
	}

	// A session only in PostgreSQL is admitted and cached in Redis.
	inPG := sessionToken()
	if _, err := c.pg.Pool.Exec(ctx, `INSERT INTO sessions (token, tenant_id, user_id, plan, expires_at) VALUES ($1, $2, $3, 'free', now() + interval '1 hour')`,
		inPG, tenant, user); err != nil {
		t.Fatal(err)
	}
	pc := openSSE(t, srv.URL, inPG, "task=task_s1")
	if pc.Status != http.StatusOK {
		t.Fatalf("SSE with a PostgreSQL session: %d %s", pc.Status, pc.Body)
	}
	ttl := c.redis.Client.TTL(ctx, sessKey(inPG)).Val()
	if ttl <= 0 || ttl > time.Hour {
		t.Fatalf("session cached with TTL %s, want within its expiry", ttl)
	}
	// Expired in the store (Redis and PostgreSQL): closed too.
	if _, err := c.pg.Pool.Exec(ctx, `UPDATE sessions SET expires_at = now() - interval '1 second' WHERE token = $1`, inPG); err != nil {
		t.Fatal(err)
	}
	c.redis.Client.Del(ctx, sessKey(inPG))
	pc.Ended(t)
	// An expired session in PostgreSQL is refused.
	resp, body = httpDo(t, http.MethodGet, srv.URL+"/v1/tasks/task_s1", inPG, "")
	wantError(t, resp, body, http.StatusUnauthorized, "unauthorized")
}

// A logout in either store ends the session's open streams within the
// re-check interval, and every node refuses its token from then on:
// deleted from PostgreSQL (the node's copy in Redis notwithstanding),
// deleted from Redis (the row in PostgreSQL notwithstanding), expired
// by a rewrite in either, or a tombstone in Redis over a live row.
func TestLogoutInEitherStoreEndsTheSession(t *testing.T) {
	c := newCluster(t)
	cfg := c.config()
	const interval = 300 * time.Millisecond
	cfg.Admission = admission.Config{SessionCheckInterval: interval, MaxConnsPerUser: 100}
	cfg.Hub.HeartbeatInterval = 200 * time.Millisecond // the hub ends revoked connections on its tick
	srv, other := startNode(t, cfg), startNode(t, cfg)
	ctx := context.Background()
	sessKey := func(tok string) string { return c.redis.Names.Prefix + "session:" + tok }
	for _, tc := range []struct {
		name          string
		inRedis, inPG bool
		logout        func(tok string) error
	}{
		{"deleted from PostgreSQL", false, true, func(tok string) error {
			_, err := c.pg.Pool.Exec(ctx, `DELETE FROM sessions WHERE token = $1`, tok)
			return err
		}},
		{"deleted from Redis", true, true, func(tok string) error { return c.redis.Client.Del(ctx, sessKey(tok)).Err() }},
		{"expired in Redis", true, false, func(tok string) error {
			return c.redis.Client.Set(ctx, sessKey(tok), fmt.Sprintf(`{"tenant_id":"t1","user_id":"u1","expires_at":%d}`, time.Now().Add(-time.Second).UnixMilli()), time.Hour).Err()
		}},
		{"a tombstone written by the login service", true, true, func(tok string) error {
			return c.redis.Client.Set(ctx, sessKey(tok), `{"revoked":true}`, time.Hour).Err()
		}},
		{"expired in PostgreSQL", false, true, func(tok string) error {
			_, err := c.pg.Pool.Exec(ctx, `UPDATE sessions SET expires_at = now() - interval '1 second' WHERE token = $1`, tok)
			return err
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tok := sessionToken()
			if tc.inRedis {
				if err := c.redis.Client.Set(ctx, sessKey(tok), `{"tenant_id":"t1","user_id":"u1"}`, time.Hour).Err(); err != nil {
					t.Fatal(err)
				}
			}
			if tc.inPG {
				if _, err := c.pg.Pool.Exec(ctx, `INSERT INTO sessions (token, tenant_id, user_id, expires_at) VALUES ($1, 't1', 'u1', now() + interval '1 hour')`, tok); err != nil {
					t.Fatal(err)
				}
			}
			sse := openSSE(t, srv.URL, tok, "task="+testenv.UniqueID("task"))
			if sse.Status != http.StatusOK {
				t.Fatalf("SSE with the session: %d %s", sse.Status, sse.Body)
			}
			ws := openWS(t, srv.URL, tok)
			ws.send(t, map[string]any{"op": "subscribe", "id": 1})
			ws.NextOf(t, "ack")
			// One re-check that saw the session where it is.
			checks := srv.Admission().Stats().SessionChecks
			testenv.Eventually(t, "a re-check of the open session", func() bool { return srv.Admission().Stats().SessionChecks > checks })
			if err := tc.logout(tok); err != nil {
				t.Fatal(err)
			}
			out := time.Now()
			late := sse.expiredAt(t, tc.name, out.Add(10*time.Second)).Sub(out)
			if code := ws.closeStatus(t); code != pushdws.StatusTokenExpired {
				t.Fatalf("WebSocket closed with %d, want %d", code, pushdws.StatusTokenExpired)
			}
			t.Logf("%s: the stream ended %v after the logout", tc.name, late.Round(time.Millisecond))
			if bound := interval + time.Second; late > bound {
				t.Fatalf("the stream ended %v after the logout, want within the re-check interval %v plus a tick and a second", late, interval)
			}
			for _, n := range []*server{srv, other} {
				resp, body := httpDo(t, http.MethodGet, n.URL+"/v1/tasks/x1", tok, "")
				wantError(t, resp, body, http.StatusUnauthorized, "unauthorized")
			}
		})
	}
}

// A session that cannot become a principal is refused as an invalid token
// (401 unauthorized, never 503), and logged once at warn, naming it by a
// hash of its token, never the token, with why. In PostgreSQL: a NULL in
// projects (which cannot even be read into a list of names), a project
// that is no valid id, a tenant or user that is no valid id. In Redis: a
// document that is no session. A row that never expires (expires_at
// infinity) is no malformed row: it is taken.
func TestMalformedSessionIsRefused(t *testing.T) {
	c := newCluster(t)
	var logs testenv.LogBuffer
	cfg := c.config()
	cfg.Logger = slog.New(slog.NewJSONHandler(&logs, nil))
	srv := startNode(t, cfg)
	ctx := context.Background()
	tenant, user := testenv.UniqueID("tenant"), testenv.UniqueID("user")
	row := func(tok, tenant, user, projects, expires string) {
		t.Helper()
		if _, err := c.pg.Pool.Exec(ctx, `INSERT INTO sessions (token, tenant_id, user_id, projects, expires_at) VALUES ($1, $2, $3, $4::text[], `+expires+`)`,
			tok, tenant, user, projects); err != nil {
			t.Fatal(err)
		}
	}
	inRedis := func(tok, doc string) {
		t.Helper()
		if err := c.redis.Client.Set(ctx, c.redis.Names.Prefix+"session:"+tok, doc, time.Hour).Err(); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		name  string
		store func(tok string)
	}{
		{"projects {NULL} in PostgreSQL", func(tok string) { row(tok, tenant, user, "{NULL}", "now() + interval '1 hour'") }},
		{"a NULL among projects in PostgreSQL", func(tok string) { row(tok, tenant, user, "{p1,NULL}", "NULL") }},
		{"an invalid project in PostgreSQL", func(tok string) { row(tok, tenant, user, `{"p 1"}`, "NULL") }},
		{"an empty tenant_id in PostgreSQL", func(tok string) { row(tok, "", user, "{}", "NULL") }},
		{"an invalid user_id in PostgreSQL", func(tok string) { row(tok, tenant, "u/1", "{}", "NULL") }},
		{"a document that is not JSON in Redis", func(tok string) { inRedis(tok, `{"tenant_id":`) }},
		{"a null project in Redis", func(tok string) {
			inRedis(tok, `{"tenant_id":"`+tenant+`","user_id":"`+user+`","projects":[null]}`)
		}},
		{"no user in Redis", func(tok string) { inRedis(tok, `{"tenant_id":"`+tenant+`"}`) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tok := sessionToken()
			tc.store(tok)
			for range 2 { // the second is answered as the first, and logged no more
				resp, body := httpDo(t, http.MethodGet, srv.URL+"/v1/tasks/task_absent", tok, "")
				wantError(t, resp, body, http.StatusUnauthorized, "unauthorized")
			}
			sum := sha256.Sum256([]byte(tok))
			id := hex.EncodeToString(sum[:6])
			var lines []map[string]any
			for line := range strings.Lines(logs.String()) {
				if strings.Contains(line, tok) {
					t.Fatalf("a log line carries the token: %s", line)
				}
				var m map[string]any
				if json.Unmarshal([]byte(line), &m) == nil && m["session"] == id {
					lines = append(lines, m)
				}
			}
			if len(lines) != 1 || lines[0]["level"] != "WARN" || lines[0]["reason"] == nil {
				t.Fatalf("log lines naming session %s: %v, want one warning with its reason", id, lines)
			}
		})
	}

	// A row that never expires is taken.
	forever := sessionToken()
	row(forever, tenant, user, "{}", "'infinity'")
	resp, body := httpDo(t, http.MethodGet, srv.URL+"/v1/tasks/task_absent", forever, "")
	wantError(t, resp, body, http.StatusNotFound, "not_found")
}
