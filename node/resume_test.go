package node_test

import (
	"fmt"
	"maps"
	"strconv"
	"strings"
	"testing"

	"github.com/pushd/pushd/internal/testenv"
	"github.com/pushd/pushd/snapshot"
)

// Resuming with task=version cursors (nodes without streams), reconnect
// after reconnect, across nodes.

// versionsCursor reads a task=version cursor; anything else fails the test.
func versionsCursor(t *testing.T, id string) map[string]int64 {
	t.Helper()
	out := make(map[string]int64)
	for part := range strings.SplitSeq(id, ",") {
		task, v, ok := strings.Cut(part, "=")
		n, err := strconv.ParseInt(v, 10, 64)
		if !ok || err != nil {
			t.Fatalf("cursor %q is not task=version pairs", id)
		}
		out[task] = n
	}
	return out
}

// wantTask reads the next event, which must be task id at version v whose
// cursor names exactly cursor, and returns the event's id.
func (c *sseClient) wantTask(t *testing.T, id string, v int64, cursor map[string]int64) string {
	t.Helper()
	ev := c.NextOf(t, "task")
	c.checkTask(t, ev, id, v, cursor)
	return ev.ID
}

func (c *sseClient) checkTask(t *testing.T, ev sseEvent, id string, v int64, cursor map[string]int64) {
	t.Helper()
	s := parseDoc(t, ev.Data)
	if s.TaskID != id || s.Version != v {
		t.Fatalf("got %s v%d, want %s v%d", s.TaskID, s.Version, id, v)
	}
	if got := versionsCursor(t, ev.ID); !maps.Equal(got, cursor) {
		t.Fatalf("%s v%d carries cursor %v, want %v", id, v, got, cursor)
	}
}

// wantNotFound reads the next event, which must refuse task id as
// not_found, without an id of its own: the client keeps its Last-Event-ID.
func (c *sseClient) wantNotFound(t *testing.T, id string) {
	t.Helper()
	ev := c.NextOf(t, "error")
	c.checkNotFound(t, ev, id)
}

func (c *sseClient) checkNotFound(t *testing.T, ev sseEvent, id string) {
	t.Helper()
	if ev.Event != "error" || !strings.Contains(ev.Data, `"not_found"`) || !strings.Contains(ev.Data, strconv.Quote(id)) || ev.ID != "" {
		t.Fatalf("got %s %s (id %q), want not_found for %s without an id", ev.Event, ev.Data, ev.ID, id)
	}
}

// wantResumed reads what a resumed connection sends before anything
// changes: task id at version v with cursor, and the refusal of missing,
// which comes once the initial reads are done. They may come in either
// order: a change made just before the reconnect may reach the node's
// cache after its initial read, and then comes as the change it is. Any
// other task fails the test.
func (c *sseClient) wantResumed(t *testing.T, id string, v int64, cursor map[string]int64, missing string) {
	t.Helper()
	var task, refused bool
	for !task || !refused {
		ev := c.Next(t)
		switch ev.Event {
		case "hello", "mode":
		case "error":
			c.checkNotFound(t, ev, missing)
			refused = true
		case "task":
			if task {
				t.Fatalf("a second task after the resume: %s", ev.Data)
			}
			c.checkTask(t, ev, id, v, cursor)
			task = true
		default:
			t.Fatalf("unexpected event %q: %s", ev.Event, ev.Data)
		}
	}
}

func TestSecondResumeOnAnotherNodeSendsOnlyWhatMovedAgain(t *testing.T) {
	c := newCluster(t)
	a := startNode(t, c.config())
	b := startNode(t, c.config())
	tenant := testenv.UniqueID("tenant")
	tasks := make([]string, 4)
	var query []string
	for i := range tasks {
		tasks[i] = testenv.UniqueID("task")
		query = append(query, "task="+tasks[i])
		c.goPublish(t, doc(tasks[i], tenant, 1, "RUNNING"))
	}
	// A task that does not exist closes the query: its refusal is sent once
	// the initial reads are done, so a connection has sent what it will
	// of its initial state by the time both the tasks and it are in.
	missing := testenv.UniqueID("task")
	q := strings.Join(append(query, "task="+missing), "&")
	tok := token(t, tenant, "u1")
	at := func(versions ...int64) map[string]int64 {
		m := make(map[string]int64)
		for i, v := range versions {
			m[tasks[i]] = v
		}
		return m
	}

	// The tasks come in the order asked, each cursor naming the ones
	// before it; the refusal may come anywhere among them, as a refusal
	// is sent as soon as the reads are done, a task once a writer takes it.
	first := openSSE(t, a.URL, tok, q)
	var last string
	refused := false
	for i := 0; i < len(tasks) || !refused; {
		ev := first.Next(t)
		switch ev.Event {
		case "hello":
		case "error":
			if refused {
				t.Fatalf("a second refusal: %s", ev.Data)
			}
			first.checkNotFound(t, ev, missing)
			refused = true
		case "task":
			if i == len(tasks) {
				t.Fatalf("a task after all four: %s", ev.Data)
			}
			versions := make([]int64, i+1)
			for j := range versions {
				versions[j] = 1
			}
			first.checkTask(t, ev, tasks[i], 1, at(versions...))
			last = ev.ID
			i++
		default:
			t.Fatalf("unexpected event %q: %s", ev.Event, ev.Data)
		}
	}
	first.Close()

	// Away, task 1 moves. On node B the client gets only it, and its
	// cursor names every task: the ones it resumed with too.
	c.goPublish(t, doc(tasks[1], tenant, 2, "RUNNING"))
	onB := openSSE(t, b.URL, tok, q, "Last-Event-ID", last)
	onB.wantResumed(t, tasks[1], 2, at(1, 2, 1, 1), missing)
	// Nothing else was queued: a change made now is the next event.
	c.goPublish(t, doc(tasks[0], tenant, 2, "RUNNING"))
	last = onB.wantTask(t, tasks[0], 2, at(2, 2, 1, 1))
	onB.Close()

	// Away again, task 3 moves. Back on node A with the newest cursor: only
	// task 3 again, not the tasks that moved before it or never did.
	c.goPublish(t, doc(tasks[3], tenant, 2, "RUNNING"))
	onA := openSSE(t, a.URL, tok, q, "Last-Event-ID", last)
	onA.wantResumed(t, tasks[3], 2, at(2, 2, 1, 2), missing)
	c.goPublish(t, doc(tasks[2], tenant, 2, "RUNNING"))
	last = onA.wantTask(t, tasks[2], 2, at(2, 2, 2, 2))
	onA.Close()

	// Nothing moved: the resumed connection sends no id at all, so the
	// client keeps the cursor it came with, and the next change extends it.
	again := openSSE(t, b.URL, tok, q, "Last-Event-ID", last)
	again.wantNotFound(t, missing)
	c.goPublish(t, doc(tasks[1], tenant, 3, "RUNNING"))
	again.wantTask(t, tasks[1], 3, at(2, 3, 2, 2))
}

// A cursor may name a version newer than the one the node has (a node
// whose copy lags, or a client's own invention): the node never sends the
// older version, and the cursor keeps what the client holds, so a later
// reconnect does not get it either. Entries of tasks the connection does
// not watch are not carried.
func TestResumeCursorNewerThanTheNodeIsKept(t *testing.T) {
	c := newCluster(t)
	s := startNode(t, c.config())
	tenant := testenv.UniqueID("tenant")
	x, y, other := testenv.UniqueID("task"), testenv.UniqueID("task"), testenv.UniqueID("task")
	c.goPublish(t, doc(x, tenant, 1, "RUNNING"))
	c.goPublish(t, doc(y, tenant, 1, "RUNNING"))
	tok := token(t, tenant, "u1")
	missing := testenv.UniqueID("task")
	q := "task=" + x + "&task=" + y + "&task=" + missing
	cursor := fmt.Sprintf("%s=5,%s=1,%s=9", x, y, other)

	cl := openSSE(t, s.URL, tok, q, "Last-Event-ID", cursor)
	cl.wantNotFound(t, missing)
	c.goPublish(t, doc(y, tenant, 2, "RUNNING"))
	cl.wantTask(t, y, 2, map[string]int64{x: 5, y: 2})
	c.goPublish(t, doc(x, tenant, 3, "RUNNING")) // older than what the client holds
	c.goPublish(t, doc(x, tenant, 6, "RUNNING"))
	cl.wantTask(t, x, 6, map[string]int64{x: 6, y: 2})
}

// With streams, the cursor is a stream position, which covers every task of
// the tenant: a second resume from the newest cursor, on the other node,
// again replays only what moved after it.
func TestSecondStreamResumeSendsOnlyWhatMovedAgain(t *testing.T) {
	c := newCluster(t)
	a := startNode(t, c.streamConfig())
	b := startNode(t, c.streamConfig())
	tenant := testenv.UniqueID("tenant")
	tasks := make([]string, 4)
	var query []string
	for i := range tasks {
		tasks[i] = testenv.UniqueID("task")
		query = append(query, "task="+tasks[i])
		streamPublish(t, c.redis.Client, c.redis.Names, tenantDoc(tasks[i], tenant, 1))
	}
	q := strings.Join(query, "&")
	tok := token(t, tenant, "u1")
	// only fails unless got is task id at version v alone.
	only := func(got map[string]*snapshot.Snapshot, id string, v int64) {
		t.Helper()
		if s := got[id]; len(got) == 1 && s != nil && s.Version == v {
			return
		}
		var sent []string
		for id, s := range got {
			sent = append(sent, fmt.Sprintf("%s v%d", id, s.Version))
		}
		t.Fatalf("resume sent %v, want only %s v%d", sent, id, v)
	}

	first := openSSE(t, a.URL, tok, q)
	initial, cursor := first.untilCursor(t)
	if len(initial) != len(tasks) {
		t.Fatalf("initial state: %d tasks, want %d", len(initial), len(tasks))
	}
	first.Close()

	// The first stream cursor of a resumed connection comes once the
	// replay was offered: whatever else it sent came before it.
	streamPublish(t, c.redis.Client, c.redis.Names, tenantDoc(tasks[1], tenant, 2))
	onB := openSSE(t, b.URL, tok, q, "Last-Event-ID", cursor)
	got, cursor := onB.untilCursor(t)
	only(got, tasks[1], 2)
	onB.Close()

	streamPublish(t, c.redis.Client, c.redis.Names, tenantDoc(tasks[3], tenant, 2))
	onA := openSSE(t, a.URL, tok, q, "Last-Event-ID", cursor)
	got, cursor = onA.untilCursor(t)
	only(got, tasks[3], 2)
	onA.Close()

	// Nothing moved: no task is due. But a node's cursor is its tail's
	// position, and node A's tail may not yet have applied the entry its
	// replay read, nor node B's tail the entries before the cursor: either
	// way task 3 can come again, at the version the client holds. A
	// resend, never a loss; anything else fails.
	again := openSSE(t, b.URL, tok, q, "Last-Event-ID", cursor)
	got, _ = again.untilCursor(t)
	if len(got) > 0 {
		only(got, tasks[3], 2)
	}
	// Nothing else is on its way: a change made now is the next event
	// but for that resend.
	streamPublish(t, c.redis.Client, c.redis.Names, tenantDoc(tasks[2], tenant, 2))
	for {
		s := again.nextTask(t)
		if s.TaskID == tasks[2] && s.Version == 2 {
			break
		}
		if s.TaskID != tasks[3] || s.Version != 2 {
			t.Fatalf("after the resume got %s v%d, want %s v2", s.TaskID, s.Version, tasks[2])
		}
	}
	if n := a.Hub().Stats().ResumeFallbacks + b.Hub().Stats().ResumeFallbacks; n != 0 {
		t.Fatalf("%d resume fallbacks, want none", n)
	}
}
