package node_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/pushd/pushd/internal/testenv"
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
