package sse

import (
	"bytes"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/pushd/pushd/hub"
	"github.com/pushd/pushd/snapshot"
)

func taskEvent(t *testing.T, task string, version int64) hub.Event {
	t.Helper()
	s, err := snapshot.Parse(fmt.Appendf(nil, `{"task_id":%q,"tenant_id":"t1","version":%d}`, task, version))
	if err != nil {
		t.Fatal(err)
	}
	return hub.Event{Kind: hub.KindTask, Snapshot: s}
}

// lastID returns the id: of the last event in b.
func lastID(b *bytes.Buffer) string {
	id := ""
	for line := range strings.SplitSeq(b.String(), "\n") {
		if v, ok := strings.CutPrefix(line, "id: "); ok {
			id = v
		}
	}
	return id
}

func TestCursorCarriesEveryDeliveredVersion(t *testing.T) {
	var e encoder
	var b bytes.Buffer
	e.render(&b, []hub.Event{taskEvent(t, "a", 1), taskEvent(t, "a", 3)})
	if id := lastID(&b); id != "a=3" {
		t.Fatalf("one task: id %q, want a=3", id)
	}
	e.render(&b, []hub.Event{taskEvent(t, "b", 7)})
	got := parseCursor(lastID(&b))
	if len(got) != 2 || got["a"] != 3 || got["b"] != 7 {
		t.Fatalf("two tasks: cursor %v, want a=3 and b=7", got)
	}
}

func TestCursorBeyondTheBoundNamesOnlyItsTask(t *testing.T) {
	var e encoder
	var b bytes.Buffer
	for i := range maxCursorTasks + 1 {
		e.render(&b, []hub.Event{taskEvent(t, fmt.Sprintf("t%d", i), 1)})
	}
	got := parseCursor(lastID(&b))
	if len(got) != 1 || got[fmt.Sprintf("t%d", maxCursorTasks)] != 1 {
		t.Fatalf("cursor %v, want only the last task", got)
	}
}

func TestParseCursorIgnoresGarbage(t *testing.T) {
	got := parseCursor("a=1,b=x,c d=2,=3,e=-1,f=5,noequals," + strings.Repeat("z", 10))
	if len(got) != 2 || got["a"] != 1 || got["f"] != 5 {
		t.Fatalf("got %v, want a=1 and f=5", got)
	}
	if parseCursor(strings.Repeat("a=1,", maxCursorLen)) != nil {
		t.Fatal("an oversized cursor was parsed")
	}
}

func TestStreamCursorIsWrittenAndVersionsStillKept(t *testing.T) {
	e := encoder{fp: "FfFfFfFf"}
	var b bytes.Buffer
	ev := taskEvent(t, "a", 2)
	ev.Cursor = "s1.AAAA"
	e.render(&b, []hub.Event{ev})
	if id := lastID(&b); id != "s1.AAAA.FfFfFfFf,a=2" {
		t.Fatalf("id %q, want the stream cursor, the fingerprint and the event's own version", id)
	}
	e.render(&b, []hub.Event{taskEvent(t, "b", 1)})
	got := parseCursor(lastID(&b))
	if len(got) != 2 || got["a"] != 2 || got["b"] != 1 {
		t.Fatalf("versions cursor after a stream cursor: %v, want a=2 and b=1", got)
	}
	b.Reset()
	e.render(&b, []hub.Event{{Kind: hub.KindSync, Cursor: "s1.BBBB"}})
	if b.String() != "event: sync\nid: s1.BBBB.FfFfFfFf\ndata: {}\n\n" {
		t.Fatalf("sync rendered as %q", b.String())
	}
}

// TestOwnCursorNamesItsTaskOnly: with cursor=own the client keeps its
// cursor, so however many tasks the connection delivered, or resumed with,
// each id names its own task's version (after the stream position, with
// one), and the encoder keeps no versions.
func TestOwnCursorNamesItsTaskOnly(t *testing.T) {
	h := newParser(t)
	r := httptest.NewRequest(http.MethodGet, "/v1/events?task=t0&task=t1&cursor=own", nil)
	r.Header.Set("Last-Event-ID", "t0=4,t1=5")
	sub, code, msg := h.ParseRequest(r)
	if code != "" {
		t.Fatal(code, msg)
	}
	e := h.newEncoder(sub, true)
	var b bytes.Buffer
	for i := range 40 {
		e.render(&b, []hub.Event{taskEvent(t, fmt.Sprintf("t%d", i), 9)})
		if id, want := lastID(&b), fmt.Sprintf("t%d=9", i); id != want {
			t.Fatalf("id %q after %d tasks, want %q", id, i+1, want)
		}
	}
	ev := taskEvent(t, "t3", 10)
	ev.Cursor = "s1.AAAA"
	e.render(&b, []hub.Event{ev})
	if id := lastID(&b); id != "s1.AAAA."+fingerprint(sub)+",t3=10" {
		t.Fatalf("id %q, want the stream cursor, the fingerprint and the event's own version", id)
	}
	if e.versions != nil || e.oneTask != "" {
		t.Fatalf("the encoder keeps versions: %v %q", e.versions, e.oneTask)
	}
}

func TestParseRequestSplitsCursorFormats(t *testing.T) {
	h := newParser(t)
	defer h.Close()
	fp := fingerprint(hub.Subscription{Tasks: []string{"a", "b"}})
	for _, tc := range []struct {
		id       string
		resume   string
		mismatch bool
		since    int
	}{
		{"s1.AbC_-9." + fp, "s1.AbC_-9", false, 0},
		{"s1.AbC_-9", "", true, 0},          // no fingerprint: a cursor of an earlier node
		{"s1.AbC_-9.AAAAAAAA", "", true, 0}, // another subscription's
		{"s1.AbC_-9.", "", true, 0},
		{"s1.." + fp, "s1.", false, 0}, // the stream refuses what is left, as corrupt
		{"a=3,b=4", "", false, 2},
		{"garbage", "", false, 0},
	} {
		r := httptest.NewRequest(http.MethodGet, "/v1/events?task=a&task=b", nil)
		r.Header.Set("Last-Event-ID", tc.id)
		sub, code, _ := h.ParseRequest(r)
		if code != "" || sub.Resume != tc.resume || sub.ResumeMismatch != tc.mismatch || len(sub.Since) != tc.since || !sub.Cursors {
			t.Fatalf("%q: resume %q mismatch %v since %v cursors %v (%s), want resume %q, mismatch %v and %d versions",
				tc.id, sub.Resume, sub.ResumeMismatch, sub.Since, sub.Cursors, code, tc.resume, tc.mismatch, tc.since)
		}
	}
}

// TestFingerprintIsOfTheCanonicalSubscription: order and repeats in the
// URL do not change it; any task, project or the user scope added or
// removed does.
func TestFingerprintIsOfTheCanonicalSubscription(t *testing.T) {
	base := fingerprint(hub.Subscription{Tasks: []string{"task_a", "task_b"}, Projects: []string{"p1"}})
	if len(base) != 8 || strings.ContainsAny(base, ".=") {
		t.Fatalf("fingerprint %q, want 8 base64url characters", base)
	}
	same := hub.Subscription{Tasks: []string{"task_b", "task_a", "task_b"}, Projects: []string{"p1", "p1"}}
	if fp := fingerprint(same); fp != base {
		t.Fatalf("reordered, repeated: %q, want %q", fp, base)
	}
	for name, s := range map[string]hub.Subscription{
		"task added":         {Tasks: []string{"task_a", "task_b", "task_c"}, Projects: []string{"p1"}},
		"task removed":       {Tasks: []string{"task_a"}, Projects: []string{"p1"}},
		"project added":      {Tasks: []string{"task_a", "task_b"}, Projects: []string{"p1", "p2"}},
		"project removed":    {Tasks: []string{"task_a", "task_b"}},
		"user scope added":   {Tasks: []string{"task_a", "task_b"}, Projects: []string{"p1"}, User: true},
		"task as project":    {Tasks: []string{"task_a"}, Projects: []string{"p1", "task_b"}},
		"ids run together":   {Tasks: []string{"task_atask_b"}, Projects: []string{"p1"}},
		"project as a task":  {Tasks: []string{"task_a", "task_b", "p1"}},
		"everything dropped": {User: true},
	} {
		if fp := fingerprint(s); fp == base {
			t.Errorf("%s: fingerprint unchanged (%q)", name, fp)
		}
	}
}

// TestStreamCursorRoundTrips: what a connection writes, a request for the
// same subscription (in another order) resumes from with the hub's own
// cursor; a request for more does not.
func TestStreamCursorRoundTrips(t *testing.T) {
	h := newParser(t)
	defer h.Close()
	parse := func(query, id string) hub.Subscription {
		t.Helper()
		r := httptest.NewRequest(http.MethodGet, "/v1/events?"+query, nil)
		r.Header.Set("Last-Event-ID", id)
		sub, code, msg := h.ParseRequest(r)
		if code != "" {
			t.Fatalf("%s: %s %s", query, code, msg)
		}
		return sub
	}
	e := h.newEncoder(parse("task=task_a&project=p1&scope=user", ""), false)
	var b bytes.Buffer
	ev := taskEvent(t, "task_a", 4)
	ev.Cursor = "s1.CETs1oHbrJKjNACmTwA"
	e.render(&b, []hub.Event{ev})
	id := lastID(&b)
	if !strings.HasPrefix(id, ev.Cursor+".") || !strings.HasSuffix(id, ",task_a=4") || len(id) != len(ev.Cursor)+1+8+len(",task_a=4") {
		t.Fatalf("id %q, want %s, a fingerprint and task_a=4", id, ev.Cursor)
	}
	b.Reset()
	e.render(&b, []hub.Event{{Kind: hub.KindSync, Cursor: ev.Cursor}})
	sync := lastID(&b)
	if sync != strings.TrimSuffix(id, ",task_a=4") {
		t.Fatalf("sync id %q, want the task's %q without its version", sync, id)
	}
	for _, id := range []string{id, sync} {
		sub := parse("scope=user&project=p1&task=task_a", id)
		if sub.Resume != ev.Cursor || sub.ResumeMismatch {
			t.Fatalf("same subscription reordered, from %q: resume %q, mismatch %v; want %q", id, sub.Resume, sub.ResumeMismatch, ev.Cursor)
		}
		if want := strings.HasSuffix(id, "=4"); want != (sub.Since["task_a"] == 4) || len(sub.Since) > 1 {
			t.Fatalf("from %q: since %v", id, sub.Since)
		}
	}
	// A subscription changed is read everything, sparing only the version
	// the cursor names.
	if sub := parse("task=task_a&task=task_b&project=p1&scope=user", id); sub.Resume != "" || !sub.ResumeMismatch || sub.Since["task_a"] != 4 {
		t.Fatalf("a task added: resume %q, mismatch %v, since %v; want no resume, task_a=4 held", sub.Resume, sub.ResumeMismatch, sub.Since)
	}
}

// TestEncoderVersionsAreBounded: a connection sent many tasks keeps no
// more versions than a cursor can carry.
func TestEncoderVersionsAreBounded(t *testing.T) {
	var e encoder
	var b []byte
	for i := range 2000 {
		s, err := snapshot.Parse(fmt.Appendf(nil, `{"task_id":"task_%04d","tenant_id":"t1","status":"RUNNING","version":7}`, i))
		if err != nil {
			t.Fatal(err)
		}
		b = e.cursor(b[:0], s, "")
		if len(e.versions) > maxCursorTasks {
			t.Fatalf("after %d tasks the encoder keeps %d versions, want at most %d", i+1, len(e.versions), maxCursorTasks)
		}
	}
	if got, want := string(b), "task_1999=7"; got != want {
		t.Fatalf("cursor %q, want %q", got, want)
	}
}

// TestResumedCursorCarriesWhatTheClientHolds: the first cursor of a
// resumed connection names the versions it resumed with, of the tasks it
// watches by id only or, with a project or the user's scope, all of them,
// and a version delivered since replaces the one resumed.
func TestResumedCursorCarriesWhatTheClientHolds(t *testing.T) {
	h := newParser(t)
	defer h.Close()
	// resumed renders task c at version 1 as the first event of a
	// connection resumed with lastID.
	resumed := func(query, lastID string) (*encoder, *bytes.Buffer) {
		t.Helper()
		r := httptest.NewRequest(http.MethodGet, "/v1/events?"+query, nil)
		r.Header.Set("Last-Event-ID", lastID)
		sub, code, _ := h.ParseRequest(r)
		if code != "" {
			t.Fatal(code)
		}
		e := h.newEncoder(sub, false)
		var b bytes.Buffer
		e.render(&b, []hub.Event{taskEvent(t, "c", 1)})
		return &e, &b
	}
	e, b := resumed("task=a&task=b&task=c", "a=3,b=4,gone=9")
	got := parseCursor(lastID(b))
	if len(got) != 3 || got["a"] != 3 || got["b"] != 4 || got["c"] != 1 {
		t.Fatalf("first cursor %v, want a=3, b=4 and c=1", got)
	}
	e.render(b, []hub.Event{taskEvent(t, "a", 5)})
	got = parseCursor(lastID(b))
	if len(got) != 3 || got["a"] != 5 || got["b"] != 4 || got["c"] != 1 {
		t.Fatalf("second cursor %v, want a=5, b=4 and c=1", got)
	}

	// Which tasks a project or the user's scope holds is not known to the
	// transport: every version resumed with is carried.
	for _, query := range []string{"project=p1", "scope=user", "task=c&project=p1"} {
		_, b := resumed(query, "a=3,b=4")
		if got := parseCursor(lastID(b)); len(got) != 3 || got["a"] != 3 || got["b"] != 4 || got["c"] != 1 {
			t.Fatalf("%s: first cursor %v, want a=3, b=4 and c=1", query, got)
		}
	}
}

// TestResumedSingleTaskCursor: a connection watching one task resumes
// with its version inline, as a new one keeps it.
func TestResumedSingleTaskCursor(t *testing.T) {
	var e encoder
	e.resumeFrom(hub.Subscription{Tasks: []string{"a"}, Since: map[string]int64{"a": 3}})
	if e.versions != nil || e.oneTask != "a" || e.oneVersion != 3 {
		t.Fatalf("encoder holds %q=%d and %v, want a=3 inline", e.oneTask, e.oneVersion, e.versions)
	}
	var b bytes.Buffer
	e.render(&b, []hub.Event{taskEvent(t, "a", 4)})
	if id := lastID(&b); id != "a=4" {
		t.Fatalf("id %q, want a=4", id)
	}
}

// TestResumedCursorIsBounded: a resume with more watched tasks than a
// cursor carries falls back to naming only each event's task.
func TestResumedCursorIsBounded(t *testing.T) {
	since := make(map[string]int64)
	var tasks []string
	for i := range maxCursorTasks + 1 {
		id := fmt.Sprintf("t%d", i)
		since[id], tasks = 1, append(tasks, id)
	}
	var e encoder
	e.resumeFrom(hub.Subscription{Tasks: tasks, Since: since})
	var b bytes.Buffer
	e.render(&b, []hub.Event{taskEvent(t, "t0", 2)})
	if id := lastID(&b); id != "t0=2" {
		t.Fatalf("id %q, want t0=2", id)
	}
}
