package node_test

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/pushd/pushd/internal/testenv"
)

func TestProjectAndUserSubscriptionsFromPostgres(t *testing.T) {
	c := newCluster(t)
	s := startNode(t, c.config())
	project, user := testenv.UniqueID("proj"), testenv.UniqueID("user")
	older := testenv.UniqueID("task")
	c.pg.InsertTask(t, testenv.Task{ID: older, TenantID: "t1", ProjectID: project, UserID: user, Status: "SUCCEEDED", Progress: 100, Version: 4})
	// The same project id in another tenant must not leak in.
	c.pg.InsertTask(t, testenv.Task{ID: testenv.UniqueID("task"), TenantID: "t2", ProjectID: project, UserID: user, Status: "RUNNING", Version: 1})

	byProject := openSSE(t, s.URL, token(t, "t1", "someone"), "project="+project)
	byUser := openWS(t, s.URL, token(t, "t1", user))
	byUser.send(t, map[string]any{"op": "subscribe", "id": 1, "scope": "user"})
	if got := byProject.nextTask(t); got.TaskID != older || got.Version != 4 {
		t.Fatalf("project watcher's first task %s v%d", got.TaskID, got.Version)
	}
	if got := byUser.nextTask(t); got.TaskID != older {
		t.Fatalf("user watcher's first task %s", got.TaskID)
	}
	byUser.NextOf(t, "ack")

	// A task created later in that project, for that user, reaches both.
	created := testenv.UniqueID("task")
	d := strings.NewReplacer(`"project_id":"p1"`, `"project_id":"`+project+`"`, `"user_id":"u1"`, `"user_id":"`+user+`"`).
		Replace(doc(created, "t1", 1, "QUEUED"))
	c.goPublish(t, d)
	if got := byProject.nextTask(t); got.TaskID != created {
		t.Fatalf("project watcher got %s, want the new task", got.TaskID)
	}
	if got := byUser.nextTask(t); got.TaskID != created {
		t.Fatalf("user watcher got %s, want the new task", got.TaskID)
	}

	// The HTTP listing agrees and shows nothing of tenant t2.
	resp, body := httpDo(t, http.MethodGet, s.URL+"/v1/projects/"+project+"/tasks", token(t, "t1", "someone"), "")
	var list struct {
		Tasks []struct{ TaskID, TenantID string }
	}
	json.Unmarshal([]byte(strings.NewReplacer("task_id", "taskid", "tenant_id", "tenantid").Replace(string(body))), &list)
	if resp.StatusCode != http.StatusOK || len(list.Tasks) != 1 || list.Tasks[0].TaskID != older || list.Tasks[0].TenantID != "t1" {
		t.Fatalf("listing %d %s", resp.StatusCode, body)
	}
}

func TestTaskReadWithETag(t *testing.T) {
	c := newCluster(t)
	s := startNode(t, c.config())
	task := testenv.UniqueID("task")
	c.goPublish(t, doc(task, "t1", 3, "RUNNING"))
	tok := token(t, "t1", "u1")
	resp, body := httpDo(t, http.MethodGet, s.URL+"/v1/tasks/"+task, tok, "")
	if resp.StatusCode != http.StatusOK || parseDoc(t, string(body)).Version != 3 || resp.Header.Get("ETag") != `"v3"` {
		t.Fatalf("GET: %d %q %s", resp.StatusCode, resp.Header.Get("ETag"), body)
	}
	resp, _ = httpDo(t, http.MethodGet, s.URL+"/v1/tasks/"+task, tok, "", "If-None-Match", `"v3"`)
	if resp.StatusCode != http.StatusNotModified {
		t.Fatalf("If-None-Match of the current version: %d, want 304", resp.StatusCode)
	}
	c.goPublish(t, doc(task, "t1", 4, "RUNNING"))
	// The node hears the change, so its cached v3 is not served again.
	testenv.Eventually(t, "the newer version served", func() bool {
		resp, body = httpDo(t, http.MethodGet, s.URL+"/v1/tasks/"+task, tok, "", "If-None-Match", `"v3"`)
		return resp.StatusCode == http.StatusOK
	})
	if parseDoc(t, string(body)).Version != 4 {
		t.Fatalf("got %s", body)
	}
}

func TestWebSocketTokenExpiryClosesWith4001(t *testing.T) {
	c := newCluster(t)
	cfg := c.config()
	cfg.Hub.HeartbeatInterval = 100 * time.Millisecond
	s := startNode(t, cfg)
	ws := openWS(t, s.URL, tokenExp(t, "t1", "u1", time.Now().Add(1500*time.Millisecond)))
	if e := ws.NextOf(t, "error"); !strings.Contains(string(e["code"]), "token_expired") {
		t.Fatalf("got %s", rawString(e))
	}
	if code := ws.closeStatus(t); code != 4001 {
		t.Fatalf("closed with %d, want 4001", code)
	}
}

func TestShutdownTellsClientsToReconnect(t *testing.T) {
	c := newCluster(t)
	cfg := c.config()
	cfg.ReconnectAfter = 3 * time.Second
	s := startNode(t, cfg)
	task := testenv.UniqueID("task")
	c.goPublish(t, doc(task, "t1", 1, "RUNNING"))
	sse := openSSE(t, s.URL, token(t, "t1", "u1"), "task="+task)
	sse.nextTask(t)
	ws := openWS(t, s.URL, token(t, "t1", "u1"))
	ws.send(t, map[string]any{"op": "subscribe", "id": 1, "tasks": []string{task}})
	ws.nextTask(t)
	ws.NextOf(t, "ack")

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- s.Shutdown(ctx) }()

	ev := sse.NextOf(t, "reconnect")
	if ev.Retry < 1 || ev.Retry > 3000 {
		t.Fatalf("SSE reconnect with retry %d, want 1..3000", ev.Retry)
	}
	sse.Ended(t)
	m := ws.NextOf(t, "reconnect")
	var after int
	json.Unmarshal(m["after_ms"], &after)
	if after < 1 || after > 3000 {
		t.Fatalf("WS reconnect after %d ms", after)
	}
	if code := ws.closeStatus(t); code != websocket.StatusServiceRestart {
		t.Fatalf("WS closed with %d, want 1012", code)
	}
	if err := <-done; err != nil {
		t.Fatalf("shutdown: %v", err)
	}
	if _, err := http.Get(s.URL + "/healthz"); err == nil {
		t.Fatal("the node still accepts connections after shutdown")
	}
}

// TestBatchReadWithETag: a polling client that sends back the ETag of its
// last batch gets 304 until a task in it moves, and another tenant's
// changes never change it.
func TestBatchReadWithETag(t *testing.T) {
	c := newCluster(t)
	s := startNode(t, c.config())
	a, b, other := testenv.UniqueID("task"), testenv.UniqueID("task"), testenv.UniqueID("task")
	c.goPublish(t, doc(a, "t1", 1, "RUNNING"))
	c.goPublish(t, doc(b, "t1", 5, "RUNNING"))
	c.goPublish(t, doc(other, "t2", 1, "RUNNING"))
	tok := token(t, "t1", "u1")
	u := s.URL + "/v1/tasks?ids=" + a + "," + b + "," + other
	resp, body := httpDo(t, http.MethodGet, u, tok, "")
	tag := resp.Header.Get("ETag")
	if resp.StatusCode != http.StatusOK || tag == "" || !strings.Contains(string(body), `"not_found":["`+other+`"]`) {
		t.Fatalf("GET: %d ETag %q %s", resp.StatusCode, tag, body)
	}
	if resp, _ := httpDo(t, http.MethodGet, u, tok, "", "If-None-Match", tag); resp.StatusCode != http.StatusNotModified {
		t.Fatalf("If-None-Match of the current batch: %d, want 304", resp.StatusCode)
	}
	c.goPublish(t, doc(other, "t2", 2, "RUNNING"))
	if resp, _ := httpDo(t, http.MethodGet, u, tok, "", "If-None-Match", tag); resp.StatusCode != http.StatusNotModified {
		t.Fatalf("after another tenant's change: %d, want 304", resp.StatusCode)
	}
	c.goPublish(t, doc(b, "t1", 6, "RUNNING"))
	testenv.Eventually(t, "a 200 after a task in the batch moved", func() bool {
		resp, body = httpDo(t, http.MethodGet, u, tok, "", "If-None-Match", tag)
		return resp.StatusCode == http.StatusOK
	})
	if resp.Header.Get("ETag") == tag || !strings.Contains(string(body), `"version":6`) {
		t.Fatalf("after the change: ETag %q (was %q), %s", resp.Header.Get("ETag"), tag, body)
	}
}

// While a node drains it keeps its listener: a balancer's readiness check
// gets 503 draining, and a new stream a JSON 503 with the code draining, so
// the balancer moves on instead of meeting a refused connection; a publish
// is still taken. Eleven streams close in ten batches over half the drain
// period, so the drain lasts seconds and the requests below run inside it.
func TestDrainingNodeAnswers503(t *testing.T) {
	c := newCluster(t)
	s := startNode(t, c.config())
	task := testenv.UniqueID("task")
	c.goPublish(t, doc(task, "t1", 1, "RUNNING"))
	tok := token(t, "t1", "u1")
	var streams []*sseClient
	for range 11 {
		sse := openSSE(t, s.URL, tok, "task="+task)
		sse.nextTask(t)
		streams = append(streams, sse)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- s.Shutdown(ctx) }()
	testenv.Eventually(t, "the hub drains", s.Hub().Draining)

	resp, body := httpDo(t, http.MethodGet, s.URL+"/readyz", "", "")
	wantError(t, resp, body, http.StatusServiceUnavailable, "draining")
	resp, body = httpDo(t, http.MethodGet, s.URL+"/v1/events?task="+task, tok, "")
	wantError(t, resp, body, http.StatusServiceUnavailable, "draining")
	// A Task State Service publishing through the balancer loses nothing
	// to a rolling restart: the node publishes until its listener closes.
	resp, body = httpDo(t, http.MethodPost, s.URL+"/v1/publish", "", doc(task, "t1", 2, "RUNNING"))
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), `"written":true`) {
		t.Fatalf("a publish to the draining node: %d %s, want 200 written", resp.StatusCode, body)
	}
	if n := s.Hub().Len(); n == 0 {
		t.Fatal("every stream closed before the requests: the drain was over, the test proves nothing")
	}

	for _, sse := range streams {
		// A stream the drain had not closed yet may get the published
		// version before its reconnect.
		for ev := sse.Next(t); ev.Event != "reconnect"; ev = sse.Next(t) {
			if ev.Event != "task" || parseDoc(t, ev.Data).Version != 2 {
				t.Fatalf("got event %q (%s), want version 2 or reconnect", ev.Event, ev.Data)
			}
		}
		sse.Ended(t)
	}
	if err := <-done; err != nil {
		t.Fatalf("shutdown: %v", err)
	}
	if _, err := http.Get(s.URL + "/healthz"); err == nil {
		t.Fatal("the listener is still open after the drain")
	}
}

// Close beside a Shutdown in progress (a test's cleanup after a failure, a
// supervisor that gives up waiting) stops the node once, without a race.
func TestCloseBesideShutdown(t *testing.T) {
	c := newCluster(t)
	s := startNode(t, c.config())
	task := testenv.UniqueID("task")
	c.goPublish(t, doc(task, "t1", 1, "RUNNING"))
	sse := openSSE(t, s.URL, token(t, "t1", "u1"), "task="+task)
	sse.nextTask(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- s.Shutdown(ctx) }()
	testenv.Eventually(t, "the hub drains", s.Hub().Draining)
	s.Close()
	sse.Ended(t)
	<-done
}
