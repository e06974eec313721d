package node_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/pushd/pushd/auth"
	"github.com/pushd/pushd/internal/testenv"
	"github.com/pushd/pushd/node"
	"github.com/pushd/pushd/snapshot"
)

// deltaClient is a client that asked for deltas and applies them as
// pushd.js does, over SSE or WebSocket. It fails the test on a patch
// whose base is not the version it holds, and on a version that is not
// newer than the one it holds.
type deltaClient struct {
	t    *testing.T
	next func() (kind string, data []byte) // the next task or patch event's kind and data
	docs map[string]any                    // per task, the document it holds
	held map[string]int64
}

// A progress tick: the fields a running task changes.
func tick(task, tenant string, v int64) string {
	return fmt.Sprintf(`{"task_id":%q,"tenant_id":%q,"project_id":"p1","user_id":"u1","status":"RUNNING","progress":%d,"stage":"provider_generating","provider":"veo","model":"veo-3","queue_position":null,"preview_asset_id":null,"output_asset_id":null,"error_code":null,"version":%d,"updated_at":%d,"x_custom":{"kept":true}}`,
		task, tenant, 10*v, v, 1710000000000+v*500)
}

// finished is the task done, with an output: a status, assets, a stage
// gone and an object new.
func finished(task, tenant string, v int64) string {
	return fmt.Sprintf(`{"task_id":%q,"tenant_id":%q,"project_id":"p1","user_id":"u1","status":"SUCCEEDED","progress":100,"provider":"veo","model":"veo-3","queue_position":null,"preview_asset_id":"asset_p","output_asset_id":"asset_o","error_code":null,"version":%d,"updated_at":%d,"x_custom":{"kept":true},"output":{"url":"https://cdn.example/o.mp4","seconds":8,"width":1280,"height":720}}`,
		task, tenant, v, 1710000000000+v*500)
}

func sseDeltas(t *testing.T, base, tok, query string, header ...string) *deltaClient {
	c := openSSE(t, base, tok, query+"&deltas=merge", header...)
	var cursor string
	return newDeltaClient(t, func() (string, []byte) { return nextSSETaskOrPatch(t, c, &cursor) })
}

func wsDeltas(t *testing.T, base, tok string, sub map[string]any) *deltaClient {
	c, _, err := dialWSQuery(t, base, tok, url.Values{"deltas": {"merge"}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	sub["op"], sub["id"] = "subscribe", 1
	c.send(t, sub)
	return newDeltaClient(t, func() (string, []byte) {
		for {
			m := c.Next(t)
			switch msgType(m) {
			case "task":
				return "task", m["task"]
			case "patch":
				delete(m, "type")
				b, _ := json.Marshal(m)
				return "patch", b
			case "ack":
			default:
				t.Fatalf("unexpected message %s", rawString(m))
			}
		}
	})
}

func newDeltaClient(t *testing.T, next func() (string, []byte)) *deltaClient {
	return &deltaClient{t: t, next: next, docs: map[string]any{}, held: map[string]int64{}}
}

// want reads the next event, which must be of kind ("task" or "patch"),
// applies it, and checks the task's document is then doc. It returns
// the size of the event's data.
func (c *deltaClient) want(kind, doc string) int {
	c.t.Helper()
	k, data := c.next()
	task, v := c.apply(k, data)
	want := parseDoc(c.t, doc)
	if task != want.TaskID || v != want.Version {
		c.t.Fatalf("got %s %s v%d, want %s v%d", k, task, v, want.TaskID, want.Version)
	}
	if k != kind {
		c.t.Fatalf("%s v%d came as a %s event (%s), want %s", task, v, k, data, kind)
	}
	if got := c.docs[task]; !reflect.DeepEqual(got, testenv.DecodeJSON(c.t, []byte(doc))) {
		c.t.Fatalf("%s v%d: the client holds %v, want %s", task, v, got, doc)
	}
	return len(data)
}

func (c *deltaClient) apply(kind string, data []byte) (string, int64) {
	c.t.Helper()
	var doc map[string]any
	switch kind {
	case "task":
		doc, _ = testenv.DecodeJSON(c.t, data).(map[string]any)
	case "patch":
		var ev struct {
			TaskID string          `json:"task_id"`
			Base   int64           `json:"base"`
			Patch  json.RawMessage `json:"patch"`
		}
		if err := json.Unmarshal(data, &ev); err != nil {
			c.t.Fatalf("patch %s: %v", data, err)
		}
		if held := c.held[ev.TaskID]; held != ev.Base {
			c.t.Fatalf("a patch of %s from v%d, but the client holds v%d: %s", ev.TaskID, ev.Base, held, data)
		}
		doc, _ = testenv.ApplyMergePatch(c.docs[ev.TaskID], testenv.DecodeJSON(c.t, ev.Patch)).(map[string]any)
	}
	task, _ := doc["task_id"].(string)
	n, _ := doc["version"].(json.Number)
	v, err := n.Int64()
	if err != nil || task == "" {
		c.t.Fatalf("a %s event leaves no task or version: %s", kind, data)
	}
	if v <= c.held[task] {
		c.t.Fatalf("%s v%d after v%d", task, v, c.held[task])
	}
	c.docs[task], c.held[task] = doc, v
	return task, v
}

// A client that asks for deltas gets its first version of a task whole
// and each later one as a patch that makes exactly the version published:
// progress ticks in a quarter of the document's bytes or less, and the
// finished task with its output. A client that did not ask gets every
// version whole.
func TestDeltasMakeEveryVersionExactly(t *testing.T) {
	s := startNode(t, node.Config{JWTSecret: testSecret})
	for _, transport := range []string{"sse", "ws"} {
		t.Run(transport, func(t *testing.T) {
			task := testenv.UniqueID("task")
			tok := token(t, "t1", "u1")
			httpPublish(t, s.URL, doc(task, "t1", 1, "QUEUED"))
			var c *deltaClient
			if transport == "sse" {
				c = sseDeltas(t, s.URL, tok, "task="+task)
			} else {
				c = wsDeltas(t, s.URL, tok, map[string]any{"tasks": []string{task}})
			}
			plain := openSSE(t, s.URL, tok, "task="+task)
			c.want("task", doc(task, "t1", 1, "QUEUED"))
			plain.nextTask(t)
			for v := int64(2); v <= 5; v++ {
				d := tick(task, "t1", v)
				httpPublish(t, s.URL, d)
				if size := c.want("patch", d); size >= len(d) {
					t.Errorf("a progress tick's patch is %d bytes, the document %d: a patch goes only where smaller", size, len(d))
				}
				if got := plain.nextTask(t); got.Version != v {
					t.Fatalf("the plain client got v%d, want v%d", got.Version, v)
				}
			}
			d := finished(task, "t1", 6)
			httpPublish(t, s.URL, d)
			c.want("patch", d)
			if ev := plain.NextOf(t, "task"); ev.Data != d {
				t.Fatalf("the plain client got %s, want the whole document %s", ev.Data, d)
			}
		})
	}
}

// A resumed connection holds no snapshot its node sent: its first version
// of each task comes whole, on either node, and the next ones as patches
// from what it sent.
func TestDeltasAfterAResumeStartWhole(t *testing.T) {
	c := newCluster(t)
	a := startNode(t, c.config())
	b := startNode(t, c.config())
	tenant := testenv.UniqueID("tenant")
	tok := token(t, tenant, "u1")
	for _, transport := range []string{"sse", "ws"} {
		t.Run(transport, func(t *testing.T) {
			task := testenv.UniqueID("task")
			c.goPublish(t, tick(task, tenant, 1))
			var first *deltaClient
			var cursor string
			if transport == "sse" {
				sc := openSSE(t, a.URL, tok, "task="+task+"&deltas=merge")
				first = newDeltaClient(t, func() (string, []byte) { return nextSSETaskOrPatch(t, sc, &cursor) })
			} else {
				first = wsDeltas(t, a.URL, tok, map[string]any{"tasks": []string{task}})
			}
			first.want("task", tick(task, tenant, 1))
			c.goPublish(t, tick(task, tenant, 2))
			first.want("patch", tick(task, tenant, 2))

			// Away, the task moves; the client comes back on node B.
			c.goPublish(t, tick(task, tenant, 3))
			var again *deltaClient
			if transport == "sse" {
				again = sseDeltas(t, b.URL, tok, "task="+task, "Last-Event-ID", cursor)
			} else {
				again = wsDeltas(t, b.URL, tok, map[string]any{"tasks": []string{task}, "since": map[string]int64{task: 2}})
			}
			again.docs, again.held = first.docs, first.held
			again.want("task", tick(task, tenant, 3))
			c.goPublish(t, tick(task, tenant, 4))
			again.want("patch", tick(task, tenant, 4))
		})
	}
}

// nextSSETaskOrPatch reads an SSE client's next task or patch event and
// keeps its id.
func nextSSETaskOrPatch(t *testing.T, c *sseClient, cursor *string) (string, []byte) {
	t.Helper()
	for {
		ev := c.Next(t)
		switch ev.Event {
		case "task", "patch":
			*cursor = ev.ID
			return ev.Event, []byte(ev.Data)
		case "hello", "mode", "sync":
		default:
			t.Fatalf("unexpected event %q: %s", ev.Event, ev.Data)
		}
	}
}

// A task moves out of one connection's grant and back: that connection
// is not sent the version outside it, and the next comes as a patch from
// the version it last sent, carrying nothing of the version between but
// what the new one holds. Another connection, granted every project, gets
// each version; the node reads the last one once and patches it from the
// version each connection holds.
func TestDeltasFromTheVersionEachConnectionHolds(t *testing.T) {
	s := startNode(t, node.Config{JWTSecret: testSecret})
	grant, err := snapshot.ParseGrant([]string{"p1"})
	if err != nil {
		t.Fatal(err)
	}
	inP1, err := auth.NewSigner(testSecret).Sign(auth.Principal{TenantID: "t1", UserID: "u9", ExpiresAt: time.Now().Add(time.Hour), Grant: grant})
	if err != nil {
		t.Fatal(err)
	}
	task := testenv.UniqueID("task")
	httpPublish(t, s.URL, tick(task, "t1", 1))
	behind := sseDeltas(t, s.URL, inP1, "task="+task)
	behind.want("task", tick(task, "t1", 1))
	all := wsDeltas(t, s.URL, token(t, "t1", "u9"), map[string]any{"tasks": []string{task}})
	all.want("task", tick(task, "t1", 1))

	moved := strings.Replace(tick(task, "t1", 2), `"project_id":"p1"`, `"project_id":"p2","secret":"of p2"`, 1)
	httpPublish(t, s.URL, moved)
	all.want("patch", moved)
	back := tick(task, "t1", 3)
	httpPublish(t, s.URL, back)
	// Version 2 never reached the connection granted p1 only: its next
	// event is version 3, from version 1, and it then holds exactly 3.
	behind.want("patch", back)
	all.want("patch", back)
	// A patch is counted once its write(2) returned, which the client may
	// beat.
	testenv.Eventually(t, "the patches counted", func() bool { return s.Hub().Stats().Patches >= 3 })
	if got := s.Hub().Stats().Patches; got != 3 {
		t.Fatalf("%d patches written, want 3", got)
	}
}

// A deltas parameter other than merge is refused with a clear error.
func TestDeltasUnknownFormatRefused(t *testing.T) {
	s := startNode(t, node.Config{JWTSecret: testSecret})
	tok := token(t, "t1", "u1")
	resp, body := httpDo(t, http.MethodGet, s.URL+"/v1/events?task=a&deltas=fossil", tok, "")
	wantError(t, resp, body, http.StatusBadRequest, "bad_request")
	_, resp, err := dialWSQuery(t, s.URL, tok, url.Values{"deltas": {"fossil"}}, nil)
	if err == nil || resp == nil || resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("a WebSocket asking for fossil deltas: %v, %v", resp, err)
	}
}
