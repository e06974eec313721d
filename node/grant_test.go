package node_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/pushd/pushd/auth"
	"github.com/pushd/pushd/hub"
	"github.com/pushd/pushd/internal/testenv"
	"github.com/pushd/pushd/snapshot"
)

// Access inside a tenant: a token sees its user's own tasks and the tasks
// of the projects it is granted, and nothing else of its tenant.

// tokenFor signs a token of user u1 granted projects (none: its own tasks
// only; "*": every project).
func tokenFor(t testing.TB, tenant string, projects ...string) string {
	t.Helper()
	return grantedToken(t, tenant, "u1", projects)
}

func grantedToken(t testing.TB, tenant, user string, projects []string) string {
	t.Helper()
	grant, err := snapshot.ParseGrant(projects)
	if err != nil {
		t.Fatal(err)
	}
	tok, err := auth.NewSigner(testSecret).Sign(auth.Principal{TenantID: tenant, UserID: user, ExpiresAt: time.Now().Add(time.Hour), Grant: grant})
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// scopedDoc is doc in a project and of a user of its own.
func scopedDoc(task, tenant, project, user string, version int64) string {
	d := doc(task, tenant, version, "RUNNING")
	d = strings.Replace(d, `"project_id":"p1"`, fmt.Sprintf(`"project_id":%q`, project), 1)
	return strings.Replace(d, `"user_id":"u1"`, fmt.Sprintf(`"user_id":%q`, user), 1)
}

// grantFixture is a tenant with a task of another user in P1 and in P2,
// and one of u1's own in P2, each in PostgreSQL and Redis.
type grantFixture struct {
	tenant, p1, p2, own string
}

func newGrantFixture(t *testing.T, c *cluster) grantFixture {
	f := grantFixture{tenant: testenv.UniqueID("t"), p1: testenv.UniqueID("inp1"), p2: testenv.UniqueID("inp2"), own: testenv.UniqueID("own")}
	for _, task := range []struct{ id, project, user string }{{f.p1, "P1", "u2"}, {f.p2, "P2", "u2"}, {f.own, "P2", "u1"}} {
		c.pg.InsertTask(t, testenv.Task{ID: task.id, TenantID: f.tenant, ProjectID: task.project, UserID: task.user, Status: "RUNNING", Version: 1, UpdatedAt: time.UnixMilli(1710000000000)})
		c.goPublish(t, scopedDoc(task.id, f.tenant, task.project, task.user, 1))
	}
	return f
}

// Every read path, HTTP, SSE and WebSocket, by id and by project: a token
// granted P1 reads P1's task and its user's own, and P2's task of another
// user looks exactly like a task that does not exist; the narrow default
// reads only its own; a token granted "*" reads all three.
func TestGrantLimitsEveryReadPath(t *testing.T) {
	c := newCluster(t)
	srv := startNode(t, c.config())
	f := newGrantFixture(t, c)
	absent := testenv.UniqueID("absent")
	version := int64(1) // of every task, raised by each case's changes
	for _, tc := range []struct {
		name     string
		projects []string
		sees     []string
	}{
		{"granted P1", []string{"P1"}, []string{f.p1, f.own}},
		{"no grant", nil, []string{f.own}},
		{"every project", []string{"*"}, []string{f.p1, f.p2, f.own}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tok := tokenFor(t, f.tenant, tc.projects...)
			all := []string{f.p1, f.p2, f.own}
			// GET /v1/tasks/:id: a hidden task answers as an absent one.
			for _, id := range all {
				resp, body := httpDo(t, http.MethodGet, srv.URL+"/v1/tasks/"+id, tok, "")
				if !slices.Contains(tc.sees, id) {
					_, absentBody := httpDo(t, http.MethodGet, srv.URL+"/v1/tasks/"+absent, tok, "")
					wantError(t, resp, body, http.StatusNotFound, "not_found")
					if string(body) != strings.ReplaceAll(string(absentBody), absent, id) {
						t.Fatalf("hidden %s answered %s, an absent task %s", id, body, absentBody)
					}
				} else if resp.StatusCode != http.StatusOK {
					t.Fatalf("GET %s: %d %s", id, resp.StatusCode, body)
				}
			}
			// GET /v1/tasks?ids= and GET /v1/projects/:id/tasks.
			seen := func(u string) []string {
				resp, body := httpDo(t, http.MethodGet, srv.URL+u, tok, "")
				var l struct {
					Tasks []struct {
						TaskID string `json:"task_id"`
					}
				}
				if resp.StatusCode != http.StatusOK || json.Unmarshal(body, &l) != nil {
					t.Fatalf("GET %s: %d %s", u, resp.StatusCode, body)
				}
				var ids []string
				for _, s := range l.Tasks {
					ids = append(ids, s.TaskID)
				}
				return ids
			}
			if got := seen("/v1/tasks?ids=" + strings.Join(all, ",")); !sameSet(got, tc.sees) {
				t.Fatalf("GET /v1/tasks read %v, want %v", got, tc.sees)
			}
			var listed []string
			for _, p := range []string{"P1", "P2"} {
				listed = append(listed, seen("/v1/projects/"+p+"/tasks")...)
			}
			if !sameSet(listed, tc.sees) {
				t.Fatalf("the project listings read %v, want %v", listed, tc.sees)
			}
			// SSE by id: the hidden task is refused as not_found.
			sse := openSSE(t, srv.URL, tok, "task="+strings.Join(all, "&task="))
			var got, refused []string
			for len(got)+len(refused) < len(all) {
				switch ev := sse.Next(t); ev.Event {
				case "task":
					got = append(got, parseDoc(t, ev.Data).TaskID)
				case "error":
					var e struct{ Code, TaskID string }
					json.Unmarshal([]byte(ev.Data), &e)
					if e.Code != "not_found" {
						t.Fatalf("SSE refusal %s, want not_found", ev.Data)
					}
					refused = append(refused, e.TaskID)
				}
			}
			if !sameSet(got, tc.sees) {
				t.Fatalf("SSE by id received %v (refused %v), want %v", got, refused, tc.sees)
			}
			// WebSocket by project: both projects' listings.
			ws := openWS(t, srv.URL, tok)
			ws.send(t, map[string]any{"op": "subscribe", "id": 1, "projects": []string{"P1", "P2"}})
			got = nil
			for range tc.sees {
				got = append(got, ws.nextTask(t).TaskID)
			}
			if m := ws.NextOf(t, "ack"); !sameSet(got, tc.sees) {
				t.Fatalf("WebSocket by project received %v before its ack %s, want %v", got, rawString(m), tc.sees)
			}
			// Live: a change to every task; only the visible ones arrive,
			// then the marker, the own task's next version.
			version++
			for _, task := range []struct{ id, project, user string }{{f.p1, "P1", "u2"}, {f.p2, "P2", "u2"}} {
				c.goPublish(t, scopedDoc(task.id, f.tenant, task.project, task.user, version))
			}
			marker := version
			c.goPublish(t, scopedDoc(f.own, f.tenant, "P2", "u1", marker))
			for _, cl := range []taskClient{{"SSE", sse.nextTask}, {"WebSocket", ws.nextTask}} {
				for {
					s := cl.next(t)
					if !slices.Contains(tc.sees, s.TaskID) {
						t.Fatalf("%s received %s, which the token does not see", cl.name, s.TaskID)
					}
					if s.TaskID == f.own && s.Version == marker {
						break
					}
				}
			}
		})
	}
}

func sameSet(a, b []string) bool {
	a, b = slices.Clone(a), slices.Clone(b)
	slices.Sort(a)
	slices.Sort(b)
	return slices.Equal(a, b)
}

// A task moved out of the granted project stops reaching the token's
// connections, by id and by project, from the version that moved it.
func TestTaskMovedOutOfAGrantIsNoLongerDelivered(t *testing.T) {
	c := newCluster(t)
	srv := startNode(t, c.config())
	f := newGrantFixture(t, c)
	tok := tokenFor(t, f.tenant, "P1")
	sse := openSSE(t, srv.URL, tok, "task="+f.p1+"&task="+f.own)
	ws := openWS(t, srv.URL, tok)
	ws.send(t, map[string]any{"op": "subscribe", "id": 1, "tasks": []string{f.own}, "projects": []string{"P1"}})
	clients := []taskClient{{"SSE", sse.nextTask}, {"WebSocket", ws.nextTask}}
	for _, cl := range clients {
		untilVersions(t, cl, map[string]int64{f.p1: 1, f.own: 1})
	}
	ws.NextOf(t, "ack")
	c.goPublish(t, scopedDoc(f.p1, f.tenant, "P1", "u2", 2))
	for _, cl := range clients {
		untilVersions(t, cl, map[string]int64{f.p1: 2})
	}
	hidden := srv.Hub().Stats().Dropped[hub.DropGrant]
	c.goPublish(t, scopedDoc(f.p1, f.tenant, "P2", "u2", 3)) // moved out of P1
	// The node's dispatchers read notifications side by side, so the moved
	// version is known dropped only once the drop is counted (the SSE
	// stream's, which watches it by id); the next version of another task,
	// published after, must then be each client's next event.
	testenv.Eventually(t, "the moved task's drop counted", func() bool {
		return srv.Hub().Stats().Dropped[hub.DropGrant] > hidden
	})
	c.goPublish(t, scopedDoc(f.own, f.tenant, "P2", "u1", 2))
	for _, cl := range clients {
		if s := cl.next(t); s.TaskID != f.own || s.Version != 2 {
			t.Fatalf("%s received %s v%d after the move, want %s v2 next", cl.name, s.TaskID, s.Version, f.own)
		}
	}
}
