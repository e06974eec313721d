package node_test

import (
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/pushd/pushd/internal/testenv"
)

// inspected is the admin listener's GET /inspect/tasks/{id} answer, as
// docs/DEPLOYMENT.md shows it.
type inspected struct {
	TaskID    string `json:"task_id"`
	TenantID  string `json:"tenant_id"`
	ProjectID string `json:"project_id"`
	UserID    string `json:"user_id"`
	Node      string
	Current   struct {
		Version int64
		Origin  string
	}
	LastHint *struct {
		Version int64
		AtMS    int64 `json:"at_ms"`
	} `json:"last_hint"`
	LastRead *struct {
		Version        int64
		Source, Origin string
		AtMS           int64 `json:"at_ms"`
	} `json:"last_read"`
	Watchers []struct {
		ConnID         string `json:"conn_id"`
		TenantID       string `json:"tenant_id"`
		UserID         string `json:"user_id"`
		Transport      string
		By             []string
		Allowed        bool
		SentVersion    int64  `json:"sent_version"`
		SentAtMS       *int64 `json:"sent_at_ms"`
		PendingVersion *int64 `json:"pending_version"`
		Writing        bool
	}
	Truncated int
}

func connIDOf(t *testing.T, hello []byte) string {
	t.Helper()
	var h struct {
		ConnID string `json:"conn_id"`
	}
	if err := json.Unmarshal(hello, &h); err != nil || h.ConnID == "" {
		t.Fatalf("hello %s has no conn_id: %v", hello, err)
	}
	return h.ConnID
}

// An operator asks the admin listener whether each connection got a
// version: an SSE stream watching the task by id and a WebSocket watching
// its project, over Redis and PostgreSQL.
func TestInspectorSaysWhatEachConnectionWasSent(t *testing.T) {
	c := newCluster(t)
	s := startNode(t, c.config())
	task, project := testenv.UniqueID("task"), testenv.UniqueID("proj")
	d := func(v int64) string {
		return strings.Replace(doc(task, "t1", v, "RUNNING"), `"project_id":"p1"`, `"project_id":"`+project+`"`, 1)
	}
	c.goPublish(t, d(1))
	start := time.Now()

	sse := openSSE(t, s.URL, token(t, "t1", "u1"), "task="+task)
	sseID := connIDOf(t, []byte(sse.NextOf(t, "hello").Data))
	if got := sse.nextTask(t); got.Version != 1 {
		t.Fatalf("SSE initial version %d, want 1", got.Version)
	}
	ws := openWS(t, s.URL, token(t, "t1", "u2"))
	hello := ws.nextAny(t)
	if msgType(hello) != "hello" {
		t.Fatalf("first WebSocket message %s, want hello", rawString(hello))
	}
	var wsID string
	if json.Unmarshal(hello["conn_id"], &wsID); wsID == "" {
		t.Fatalf("WebSocket hello %s has no conn_id", rawString(hello))
	}
	ws.send(t, map[string]any{"op": "subscribe", "id": 1, "projects": []string{project}})
	// The project's listing comes from PostgreSQL, which has no row of the
	// task: only the ack, then the task as it changes.
	ws.NextOf(t, "ack")

	c.goPublish(t, d(2))
	if got := sse.nextTask(t); got.Version != 2 {
		t.Fatalf("SSE got version %d, want 2", got.Version)
	}
	if got := ws.nextTask(t); got.Version != 2 {
		t.Fatalf("WebSocket got version %d, want 2", got.Version)
	}

	resp, body := httpDo(t, http.MethodGet, s.AdminURL+"/inspect/tasks/"+task, "", "")
	if resp.StatusCode != http.StatusOK || !strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json") {
		t.Fatalf("inspector answered %d %q: %s", resp.StatusCode, resp.Header.Get("Content-Type"), body)
	}
	var got inspected
	if err := json.Unmarshal(body, &got); err != nil {
		t.Fatalf("inspector answered %s: %v", body, err)
	}
	t.Logf("inspector: %s", body)
	if got.TaskID != task || got.TenantID != "t1" || got.ProjectID != project || got.Current.Version != 2 || got.Truncated != 0 {
		t.Errorf("inspected %+v, want task %s of t1 in %s at version 2, nothing truncated", got, task, project)
	}
	if len(got.Watchers) != 2 {
		t.Fatalf("%d watchers, want the SSE stream and the WebSocket: %s", len(got.Watchers), body)
	}
	want := map[string]struct{ user, transport, by string }{
		sseID: {"u1", "sse", "id"},
		wsID:  {"u2", "websocket", "project"},
	}
	now := time.Now()
	for _, w := range got.Watchers {
		exp, ok := want[w.ConnID]
		if !ok {
			t.Fatalf("watcher %s is neither connection (%s, %s)", w.ConnID, sseID, wsID)
		}
		if w.TenantID != "t1" || w.UserID != exp.user || w.Transport != exp.transport || !slices.Equal(w.By, []string{exp.by}) || !w.Allowed {
			t.Errorf("watcher %+v, want user %s over %s by %s, allowed", w, exp.user, exp.transport, exp.by)
		}
		// Sent times are whole seconds of the node's uptime, rounded down.
		if w.SentVersion != 2 || w.SentAtMS == nil || *w.SentAtMS < start.Add(-time.Second).UnixMilli() || *w.SentAtMS > now.UnixMilli() {
			t.Errorf("watcher %s sent version %d at %v, want 2 between %v and %v", w.ConnID, w.SentVersion, w.SentAtMS, start, now)
		}
		if w.PendingVersion != nil {
			t.Errorf("watcher %s has version %d pending, want none", w.ConnID, *w.PendingVersion)
		}
	}
	if got.LastHint == nil || got.LastHint.Version != 2 || got.LastHint.AtMS < start.UnixMilli() {
		t.Errorf("last hint %+v, want version 2 since the test began", got.LastHint)
	}
	// The hint's read goes to Redis; a stream entry or a repair round may
	// read the task again after it, from the copy the hint's read cached.
	if r := got.LastRead; r == nil || r.Version != 2 || r.Origin != "redis" || !slices.Contains([]string{"hint", "stream", "repair"}, r.Source) {
		t.Errorf("last read %+v, want version 2 from redis", r)
	}

	// Only on the admin listener.
	if resp, body := httpDo(t, http.MethodGet, s.URL+"/inspect/tasks/"+task, "", ""); resp.StatusCode != http.StatusNotFound {
		t.Errorf("the client listener answered the inspector %d %s, want 404", resp.StatusCode, body)
	}
	resp, body = httpDo(t, http.MethodGet, s.AdminURL+"/inspect/tasks/bad%20id", "", "")
	wantError(t, resp, body, http.StatusBadRequest, "invalid_id")
	resp, body = httpDo(t, http.MethodGet, s.AdminURL+"/inspect/tasks/"+testenv.UniqueID("none"), "", "")
	wantError(t, resp, body, http.StatusNotFound, "not_found")
	resp, body = httpDo(t, http.MethodGet, s.AdminURL+"/inspect/nothing", "", "")
	wantError(t, resp, body, http.StatusNotFound, "not_found")
	if !strings.Contains(string(body), "/inspect/tasks/{id}") {
		t.Errorf("the admin listener's 404 %s does not name the inspector", body)
	}
}
