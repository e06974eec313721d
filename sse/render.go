package sse

import (
	"bytes"
	"encoding/json"
	"strconv"
	"sync"

	"github.com/pushd/pushd/hub"
	"github.com/pushd/pushd/snapshot"
)

// encoder renders events as text/event-stream. It belongs to one
// connection and is used by whichever writer holds the connection.
type encoder struct {
	retry int64  // ms, sent with hello
	fp    string // the fingerprint of the connection's subscription, on every stream cursor
	// The delivered versions, for the id: cursor. Most connections watch
	// one task, so the first is kept inline and the map is made only for a
	// second. Past maxCursorTasks a cursor names only its own event's task,
	// so the map is dropped for good (many): it would only grow.
	oneTask    string
	oneVersion int64
	versions   map[string]int64
	many       bool
	// own: the client keeps its resume cursor itself (cursor=own), so an
	// id names its own event's task only, however many the connection
	// watches, and no versions are kept here.
	own bool
}

// resumeFrom records the versions a resuming client holds (its
// Last-Event-ID) of the tasks it watches, so the cursors of this
// connection name them too: without them, the cursor after one reconnect
// names only what moved since, and a second reconnect sends again every
// task that did not move. Of a subscription by id alone, entries of tasks
// not watched are left out: they would ride along in every cursor for
// nothing. Which tasks a project or the user's scope holds is not known
// here, so with one every entry is kept (within maxCursorTasks). A claimed
// version newer than the node's current one is kept as claimed: the hub
// holds the client to it too (Subscription.Since), so every connection
// decides alike what to send. It must be called before the first event is
// rendered.
func (e *encoder) resumeFrom(s hub.Subscription) {
	if len(s.Projects) > 0 || s.User {
		for id, v := range s.Since {
			e.record(id, v)
		}
		return
	}
	for _, id := range s.Tasks {
		if v := s.Since[id]; v > 0 {
			e.record(id, v)
		}
	}
}

// record keeps v as the version of task id the client holds.
func (e *encoder) record(id string, v int64) {
	switch {
	case e.many:
	case e.versions == nil && (e.oneTask == "" || e.oneTask == id):
		e.oneTask, e.oneVersion = id, v
	case e.versions == nil:
		e.versions = map[string]int64{e.oneTask: e.oneVersion, id: v}
	default:
		e.versions[id] = v
		if len(e.versions) > maxCursorTasks {
			e.versions, e.many = nil, true
		}
	}
}

// cursor records s as delivered and appends the connection's cursor to b:
// the hub's stream cursor when the event carries one, followed by the
// event's own version (see appendOwnVersion), else the versions. The
// versions are recorded either way: an event without a stream cursor may
// follow one.
func (e *encoder) cursor(b []byte, s *snapshot.Snapshot, streamCursor string) []byte {
	if !e.own {
		e.record(s.TaskID, s.Version)
	}
	switch {
	case streamCursor != "":
		return appendOwnVersion(appendStreamCursor(b, streamCursor, e.fp), s)
	case e.versions != nil:
		return encodeCursor(b, e.versions)
	}
	b = append(b, s.TaskID...)
	b = append(b, '=')
	return strconv.AppendInt(b, s.Version, 10)
}

var bufPool = sync.Pool{New: func() any { return new(bytes.Buffer) }}

// maxPooledBuf keeps a burst's large buffer from being pooled forever.
const maxPooledBuf = 64 << 10

func getBuf() *bytes.Buffer { return bufPool.Get().(*bytes.Buffer) }

func putBuf(b *bytes.Buffer) {
	if b.Cap() <= maxPooledBuf {
		b.Reset()
		bufPool.Put(b)
	}
}

// render appends every event to b.
func (e *encoder) render(b *bytes.Buffer, events []hub.Event) {
	for i := range events {
		e.renderOne(b, &events[i])
	}
}

func (e *encoder) renderOne(b *bytes.Buffer, ev *hub.Event) {
	switch ev.Kind {
	case hub.KindTask:
		data := ev.Snapshot.JSON()
		if ev.Patch != nil {
			b.WriteString("event: patch\nid: ")
			data = ev.Patch.Event
		} else {
			b.WriteString("event: task\nid: ")
		}
		b.Write(e.cursor(b.AvailableBuffer(), ev.Snapshot, ev.Cursor))
		b.WriteString("\ndata: ")
		b.Write(data)
		b.WriteString("\n\n")
	case hub.KindHello:
		writeRetry(b, e.retry)
		writeJSON(b, "hello", struct {
			ConnID      string `json:"conn_id"`
			Node        string `json:"node"`
			Mode        string `json:"mode"`
			Reason      string `json:"reason,omitempty"`
			HeartbeatMS int64  `json:"heartbeat_ms"`
		}{ev.ConnID, ev.Node, ev.Mode, ev.Reason, ev.HeartbeatMS})
	case hub.KindMode:
		writeJSON(b, "mode", struct {
			Mode   string `json:"mode"`
			Reason string `json:"reason,omitempty"`
		}{ev.Mode, ev.Reason})
	case hub.KindError:
		writeJSON(b, "error", struct {
			Code         string `json:"code"`
			Message      string `json:"message,omitempty"`
			TaskID       string `json:"task_id,omitempty"`
			ProjectID    string `json:"project_id,omitempty"`
			RetryAfter   int64  `json:"retry_after,omitempty"`
			RetryAfterMS int64  `json:"retry_after_ms,omitempty"`
		}{ev.Code, ev.Message, ev.TaskID, ev.ProjectID, ev.RetryAfter, ev.RetryAfterMS})
	case hub.KindSync:
		// Only the id matters: EventSource keeps it as the Last-Event-ID it
		// reconnects with. A browser with no listener for "sync" sees
		// nothing.
		b.WriteString("event: sync\nid: ")
		b.Write(appendStreamCursor(b.AvailableBuffer(), ev.Cursor, e.fp))
		b.WriteString("\ndata: {}\n\n")
	case hub.KindHeartbeat:
		// An event, not a comment: EventSource dispatches events only, and
		// a client tells an idle live stream from a dead silent one by what
		// it is shown. Data is {} so that every event's data is JSON.
		b.WriteString(heartbeatEvent)
	case hub.KindReconnect:
		// EventSource waits retry ms before reconnecting once the stream ends.
		writeRetry(b, int64(ev.AfterMS))
		writeJSON(b, "reconnect", struct {
			AfterMS int `json:"after_ms"`
		}{ev.AfterMS})
	}
}

// heartbeatEvent is what a connection idle for the heartbeat interval is
// sent.
const heartbeatEvent = "event: heartbeat\ndata: {}\n\n"

// writeRetry sets the EventSource's reconnect delay, in ms.
func writeRetry(b *bytes.Buffer, ms int64) {
	b.WriteString("retry: ")
	b.Write(strconv.AppendInt(b.AvailableBuffer(), ms, 10))
	b.WriteString("\n")
}

func writeJSON(b *bytes.Buffer, event string, v any) {
	b.WriteString("event: ")
	b.WriteString(event)
	b.WriteString("\ndata: ")
	json.NewEncoder(b).Encode(v) // ends with the newline that closes the data line
	b.WriteString("\n")
}
