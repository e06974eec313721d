package node_test

import (
	"bytes"
	"encoding/json"
	"net/http"
	"os"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/pushd/pushd/internal/testenv"
	"github.com/pushd/pushd/node"
	"github.com/pushd/pushd/snapshot"
)

// TestProtocolResumeTranscripts replays the resume transcripts of
// docs/PROTOCOL.md against a node: the snapshots the answers show are
// published, the requests sent, and the answers compared with the
// document's by structure: the same events or messages, the same
// snapshots byte for byte, JSON objects with the same fields, cursors that
// name what the connection delivered; connection ids, the retry jitter and
// tokens differ per run. So the document cannot drift from the node.
func TestProtocolResumeTranscripts(t *testing.T) {
	doc, err := os.ReadFile("../docs/PROTOCOL.md")
	if err != nil {
		t.Fatal(err)
	}
	s := startNode(t, node.Config{JWTSecret: testSecret, NodeName: "node-a"})
	published := map[string]int64{}
	publish := func(docs ...[]byte) {
		t.Helper()
		for _, d := range docs {
			snap := parseDoc(t, string(d))
			if published[snap.TaskID] >= snap.Version {
				continue
			}
			if resp, body := httpDo(t, http.MethodPost, s.URL+"/v1/publish", "", string(d)); resp.StatusCode != http.StatusOK {
				t.Fatalf("publish %s: %d %s", d, resp.StatusCode, body)
			}
			published[snap.TaskID] = snap.Version
		}
	}
	// A token about to expire ends each stream, so that what a stream
	// does not carry is known once it ends.
	shortToken := func() string { return tokenExp(t, "t1", "u1", time.Now().Add(2*time.Second)) }

	t.Run("SSE", func(t *testing.T) {
		blocks := codeBlocks(t, section(t, doc, "### A resume, step by step"))
		if len(blocks) != 4 {
			t.Fatalf("the SSE transcript has %d code blocks, want 4: request, answer, request, answer", len(blocks))
		}
		first, firstAnswer := parseRequest(t, blocks[0]), parseAnswer(t, blocks[1])
		again, againAnswer := parseRequest(t, blocks[2]), parseAnswer(t, blocks[3])

		publish(firstAnswer.snapshots()...)
		cl := openSSE(t, s.URL, shortToken(), first.query, first.header...)
		got := firstAnswer.check(t, "the first stream", cl, nil)

		// The reconnect sends the last id the stream carried, which the
		// document shows as its last id too.
		docCursor := lastID(firstAnswer.events)
		if sentCursor := again.get("Last-Event-ID"); !sameCursor(sentCursor, docCursor) {
			t.Fatalf("the reconnect sends Last-Event-ID %q; the first answer's last id is %q", sentCursor, docCursor)
		}
		publish(againAnswer.snapshots()...)
		header := append(slices.Clone(again.header), "Last-Event-ID", lastID(got))
		cl = openSSE(t, s.URL, shortToken(), again.query, header...)
		againAnswer.check(t, "the resumed stream", cl, parseCursor(docCursor))
	})

	t.Run("WebSocket", func(t *testing.T) {
		blocks := codeBlocks(t, section(t, doc, "### Resuming with `since`"))
		if len(blocks) != 1 {
			t.Fatalf("the WebSocket transcript has %d code blocks, want 1", len(blocks))
		}
		lines := strings.Split(strings.TrimSpace(string(blocks[0])), "\n")
		if len(lines) < 2 || !strings.HasPrefix(lines[0], "> GET /v1/ws?") || lines[1] != "< HTTP/1.1 101 Switching Protocols" {
			t.Fatalf("the WebSocket transcript starts %q; want the upgrade and its answer", lines[:min(2, len(lines))])
		}
		for _, l := range lines[2:] {
			if m := serverMessage(l); m != nil {
				if raw, ok := m["task"]; ok {
					publish(raw)
				}
			}
		}
		ws := openWS(t, s.URL, token(t, "t1", "u1"))
		for i, l := range lines[2:] {
			switch {
			case strings.HasPrefix(l, "> "):
				var req map[string]any
				if err := json.Unmarshal([]byte(l[2:]), &req); err != nil {
					t.Fatalf("line %d: %q: %v", i+3, l, err)
				}
				ws.send(t, req)
			case strings.HasPrefix(l, "< "):
				want := serverMessage(l)
				if want == nil {
					t.Fatalf("line %d: %q is no JSON message", i+3, l)
				}
				m := ws.nextAny(t)
				for msgType(m) == "heartbeat" {
					m = ws.nextAny(t)
				}
				compareMessage(t, l[2:], want, m)
			default:
				t.Fatalf("line %d: %q starts with neither > nor <", i+3, l)
			}
		}
	})
}

// section is the text under heading, up to the next heading of any level.
func section(t *testing.T, doc []byte, heading string) []byte {
	t.Helper()
	_, rest, ok := bytes.Cut(doc, []byte("\n"+heading+"\n"))
	if !ok {
		t.Fatalf("docs/PROTOCOL.md has no %q", heading)
	}
	if i := regexp.MustCompile(`\n#+ `).FindIndex(rest); i != nil {
		rest = rest[:i[0]]
	}
	return rest
}

// codeBlocks are the fenced blocks of a section, without their fences.
func codeBlocks(t *testing.T, sec []byte) [][]byte {
	t.Helper()
	parts := strings.Split(string(sec), "\n```")
	if len(parts)%2 == 0 {
		t.Fatal("a code block is not closed")
	}
	var blocks [][]byte
	for i := 1; i < len(parts); i += 2 {
		_, body, _ := strings.Cut(parts[i], "\n") // the fence's info string
		blocks = append(blocks, []byte(body))
	}
	return blocks
}

// docRequest is a transcript's GET request: its query, and its headers but
// Host and Authorization, as name, value pairs.
type docRequest struct {
	query  string
	header []string
}

func (r docRequest) get(name string) string {
	for i := 0; i+1 < len(r.header); i += 2 {
		if strings.EqualFold(r.header[i], name) {
			return r.header[i+1]
		}
	}
	return ""
}

func parseRequest(t *testing.T, block []byte) docRequest {
	t.Helper()
	lines := strings.Split(strings.TrimSpace(string(block)), "\n")
	target, ok := strings.CutPrefix(lines[0], "GET /v1/events?")
	target, ok2 := strings.CutSuffix(target, " HTTP/1.1")
	if !ok || !ok2 {
		t.Fatalf("request line %q, want GET /v1/events?... HTTP/1.1", lines[0])
	}
	r := docRequest{query: target}
	for _, l := range lines[1:] {
		name, value, _ := strings.Cut(l, ": ")
		if name != "Host" && name != "Authorization" {
			r.header = append(r.header, name, value)
		}
	}
	if !strings.HasPrefix(lines[len(lines)-1], "Authorization: Bearer ") && r.get("Last-Event-ID") == "" {
		t.Fatalf("request %q sends no token", block)
	}
	return r
}

// docAnswer is a transcript's answer to a stream request.
type docAnswer struct {
	header http.Header
	events []testenv.SSEEvent
}

func parseAnswer(t *testing.T, block []byte) docAnswer {
	t.Helper()
	head, body, ok := strings.Cut(string(block), "\n\n")
	if !ok {
		t.Fatalf("answer %q has no body", block)
	}
	lines := strings.Split(head, "\n")
	if lines[0] != "HTTP/1.1 200 OK" {
		t.Fatalf("answer's status line %q", lines[0])
	}
	a := docAnswer{header: http.Header{}}
	for _, l := range lines[1:] {
		name, value, _ := strings.Cut(l, ": ")
		a.header.Add(name, value)
	}
	// The blank line that dispatches the last event may be the block's end.
	testenv.ReadSSE(strings.NewReader(body+"\n"), func(ev testenv.SSEEvent) { a.events = append(a.events, ev) })
	if len(a.snapshots()) == 0 {
		t.Fatalf("answer %q carries no task", block)
	}
	return a
}

// snapshots are the documents of the answer's task events.
func (a docAnswer) snapshots() [][]byte {
	var docs [][]byte
	for _, ev := range a.events {
		if ev.Event == "task" {
			docs = append(docs, []byte(ev.Data))
		}
	}
	return docs
}

// check reads cl's stream to its end and compares it with the answer;
// since is what the request's cursor named. A stream that goes on past
// the answer may carry only the expiry of its token, which the document
// leaves out. It returns the events read.
func (a docAnswer) check(t *testing.T, name string, cl *sseClient, since map[string]int64) []testenv.SSEEvent {
	t.Helper()
	if cl.Status != http.StatusOK {
		t.Fatalf("%s: status %d %s", name, cl.Status, cl.Body)
	}
	for key, values := range a.header {
		if key == "Connection" {
			continue // Go's client transport takes it out of the header
		}
		if got := cl.Header.Values(key); !slices.Equal(got, values) {
			t.Errorf("%s: header %s %q, the document says %q", name, key, got, values)
		}
	}
	var got []testenv.SSEEvent
	for {
		ev, ok := cl.NextOrEnd(t)
		if !ok {
			break
		}
		got = append(got, ev)
	}
	if n := len(got); n == len(a.events)+1 && got[n-1].Event == "error" && strings.Contains(got[n-1].Data, `"token_expired"`) {
		got = got[:n-1]
	}
	if len(got) != len(a.events) {
		t.Fatalf("%s: %d events %+v; the document shows %d %+v", name, len(got), got, len(a.events), a.events)
	}
	checkCursors(t, name+" (the document)", a.events, since)
	checkCursors(t, name, got, since)
	var wantTasks, gotTasks []string
	for i, want := range a.events {
		ev := got[i]
		if ev.Event != want.Event || (ev.Retry > 0) != (want.Retry > 0) || (ev.ID != "") != (want.ID != "") {
			t.Fatalf("%s: event %d is %+v; the document shows %+v", name, i, ev, want)
		}
		if want.Event == "task" { // in no fixed order
			wantTasks, gotTasks = append(wantTasks, want.Data), append(gotTasks, ev.Data)
			continue
		}
		compareJSON(t, name+" "+want.Event, want.Data, ev.Data)
	}
	slices.Sort(wantTasks)
	slices.Sort(gotTasks)
	if !slices.Equal(wantTasks, gotTasks) {
		t.Fatalf("%s: snapshots\n%s\nthe document shows\n%s", name, strings.Join(gotTasks, "\n"), strings.Join(wantTasks, "\n"))
	}
	return got
}

// checkCursors checks that each task event's id is a version cursor naming
// every task the connection delivered or resumed with, at its latest
// version.
func checkCursors(t *testing.T, name string, events []testenv.SSEEvent, since map[string]int64) {
	t.Helper()
	held := map[string]int64{}
	for id, v := range since {
		held[id] = v
	}
	for _, ev := range events {
		if ev.Event != "task" {
			continue
		}
		s := parseDoc(t, ev.Data)
		held[s.TaskID] = s.Version
		if got := parseCursor(ev.ID); !reflect.DeepEqual(got, held) {
			t.Fatalf("%s: the cursor of %s v%d is %q, want one naming %v", name, s.TaskID, s.Version, ev.ID, held)
		}
	}
}

func lastID(events []testenv.SSEEvent) string {
	id := ""
	for _, ev := range events {
		if ev.ID != "" {
			id = ev.ID
		}
	}
	return id
}

// parseCursor reads a version cursor: task=version pairs joined by ",".
func parseCursor(c string) map[string]int64 {
	m := map[string]int64{}
	for pair := range strings.SplitSeq(c, ",") {
		id, v, _ := strings.Cut(pair, "=")
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || !snapshot.ValidID(id) {
			return nil
		}
		m[id] = n
	}
	return m
}

func sameCursor(a, b string) bool {
	ca, cb := parseCursor(a), parseCursor(b)
	return ca != nil && reflect.DeepEqual(ca, cb)
}

// varying are the fields whose values differ per connection or per
// wording: compared by type only.
var varying = map[string]bool{"conn_id": true, "message": true}

// compareJSON compares two JSON objects: the same fields in the same
// order, with the same values but those that vary.
func compareJSON(t *testing.T, name, want, got string) {
	t.Helper()
	wantKeys, gotKeys := topKeys(t, want), topKeys(t, got)
	if !slices.Equal(wantKeys, gotKeys) {
		t.Fatalf("%s: fields %q, the document shows %q", name, gotKeys, wantKeys)
	}
	var w, g map[string]any
	json.Unmarshal([]byte(want), &w)
	json.Unmarshal([]byte(got), &g)
	compareFields(t, name, w, g)
}

func compareFields(t *testing.T, name string, want, got map[string]any) {
	t.Helper()
	for k, wv := range want {
		gv := got[k]
		if varying[k] {
			if reflect.TypeOf(wv) != reflect.TypeOf(gv) {
				t.Fatalf("%s: %s is %v, the document shows %v", name, k, gv, wv)
			}
			continue
		}
		if !reflect.DeepEqual(wv, gv) {
			t.Fatalf("%s: %s is %v, the document shows %v", name, k, gv, wv)
		}
	}
	if id, ok := got["conn_id"].(string); ok && !regexp.MustCompile(`^[0-9a-f]{16}$`).MatchString(id) {
		t.Fatalf("%s: conn_id %q is not 16 hex characters", name, id)
	}
}

// topKeys are the names of a JSON object's fields, in order.
func topKeys(t *testing.T, s string) []string {
	t.Helper()
	dec := json.NewDecoder(strings.NewReader(s))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		t.Fatalf("%q is not a JSON object", s)
	}
	var keys []string
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			t.Fatalf("%q: %v", s, err)
		}
		keys = append(keys, tok.(string))
		var skip json.RawMessage
		if err := dec.Decode(&skip); err != nil {
			t.Fatalf("%q: %v", s, err)
		}
	}
	return keys
}

// serverMessage is a transcript line of the node's as JSON, or nil.
func serverMessage(line string) map[string]json.RawMessage {
	s, ok := strings.CutPrefix(line, "< ")
	if !ok {
		return nil
	}
	var m map[string]json.RawMessage
	if json.Unmarshal([]byte(s), &m) != nil {
		return nil
	}
	return m
}

// compareMessage compares a WebSocket message with the document's: the
// same fields, a task's snapshot byte for byte, the rest as compareJSON.
func compareMessage(t *testing.T, line string, want, got map[string]json.RawMessage) {
	t.Helper()
	name := "WebSocket " + msgType(want)
	if msgType(got) != msgType(want) {
		t.Fatalf("%s: got %s", name, rawString(got))
	}
	wantKeys, gotKeys := slices.Sorted(mapKeys(want)), slices.Sorted(mapKeys(got))
	if !slices.Equal(wantKeys, gotKeys) {
		t.Fatalf("%s: fields %q, the document shows %q (%s)", name, gotKeys, wantKeys, line)
	}
	if w, ok := want["task"]; ok {
		if !bytes.Equal(w, got["task"]) {
			t.Fatalf("%s: %s, the document shows %s", name, got["task"], w)
		}
		return
	}
	var w, g map[string]any
	json.Unmarshal([]byte(line), &w)
	json.Unmarshal([]byte(rawString(got)), &g)
	compareFields(t, name, w, g)
}

func mapKeys(m map[string]json.RawMessage) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}
