// Package sse is the EventSource transport: GET /v1/events streams a
// connection's hello, task snapshots, mode changes, refusals and heartbeats
// as text/event-stream.
package sse

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/pushd/pushd/hub"
	"github.com/pushd/pushd/internal/httperr"
	"github.com/pushd/pushd/snapshot"
)

// Config configures a Handler; zero values have defaults.
type Config struct {
	Hub *hub.Hub // required
	// Retry is the base reconnect delay sent in the retry: field; each
	// connection adds up to 50 % jitter so a fleet's clients do not return
	// together. Zero means 2s.
	Retry time.Duration
	// WriteTimeout bounds each write; a client slower than that is
	// disconnected and resyncs on reconnect. Zero means 10s.
	WriteTimeout time.Duration
	// SubscribeTimeout bounds the initial reads of a new connection; zero means 10s.
	SubscribeTimeout time.Duration
	// MaxTasks bounds the task and project parameters of one request; zero means 100.
	MaxTasks int
	Logger   *slog.Logger // nil means slog.Default()
}

// Handler serves the EventSource stream.
type Handler struct {
	cfg Config
	log *slog.Logger
}

// New returns a Handler.
func New(cfg Config) *Handler {
	if cfg.Retry <= 0 {
		cfg.Retry = 2 * time.Second
	}
	if cfg.WriteTimeout <= 0 {
		cfg.WriteTimeout = 10 * time.Second
	}
	if cfg.SubscribeTimeout <= 0 {
		cfg.SubscribeTimeout = 10 * time.Second
	}
	if cfg.MaxTasks <= 0 {
		cfg.MaxTasks = 100
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &Handler{cfg: cfg, log: cfg.Logger}
}

var allowedParams = map[string]bool{
	"task": true, "project": true, "scope": true, "last_event_id": true, "access_token": true,
}

// ParseRequest reads the subscription of a /v1/events request. It returns a
// code and message for a 400 when the request is malformed.
func (h *Handler) ParseRequest(r *http.Request) (hub.Subscription, string, string) {
	var s hub.Subscription
	q := r.URL.Query()
	for k := range q {
		if !allowedParams[k] {
			return s, httperr.UnknownParameter, "unknown parameter " + strconv.Quote(k)
		}
	}
	s.Tasks = q["task"]
	s.Projects = q["project"]
	if len(s.Tasks)+len(s.Projects) > h.cfg.MaxTasks {
		return s, httperr.TooMany, "at most " + strconv.Itoa(h.cfg.MaxTasks) + " tasks and projects per connection"
	}
	for _, id := range append(s.Tasks[:len(s.Tasks):len(s.Tasks)], s.Projects...) {
		if !snapshot.ValidID(id) {
			return s, httperr.InvalidID, "invalid id " + strconv.Quote(truncate(id, 64))
		}
	}
	switch scope := q["scope"]; {
	case len(scope) == 0:
	case len(scope) == 1 && scope[0] == "user":
		s.User = true
	default:
		return s, httperr.BadRequest, `scope must be "user"`
	}
	if len(s.Tasks) == 0 && len(s.Projects) == 0 && !s.User {
		return s, httperr.BadRequest, "subscribe to at least one task, project or scope=user"
	}
	cursor := r.Header.Get("Last-Event-ID")
	if cursor == "" {
		cursor = q.Get("last_event_id")
	}
	s.Since = parseCursor(cursor)
	return s, "", ""
}

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n] + "..."
	}
	return s
}

// Serve streams to an authenticated client. The caller has authenticated p
// and checked the method.
func (h *Handler) Serve(w http.ResponseWriter, r *http.Request, p hub.Principal) {
	sub, code, msg := h.ParseRequest(r)
	if code != "" {
		httperr.Write(w, http.StatusBadRequest, code, msg)
		return
	}
	if h.cfg.Hub.Draining() {
		httperr.Write(w, http.StatusServiceUnavailable, httperr.Draining, "the node is shutting down; reconnect")
		return
	}
	rc := http.NewResponseController(w)
	hdr := w.Header()
	hdr.Set("Content-Type", "text/event-stream")
	hdr.Set("Cache-Control", "no-cache")
	hdr.Set("X-Accel-Buffering", "no") // nginx must not buffer the stream
	w.WriteHeader(http.StatusOK)
	rc.SetWriteDeadline(time.Now().Add(h.cfg.WriteTimeout))
	if err := rc.Flush(); err != nil {
		return
	}

	retry := h.cfg.Retry + rand.N(h.cfg.Retry/2+1)
	s := &sink{w: w, rc: rc, timeout: h.cfg.WriteTimeout, retry: retry, done: make(chan struct{})}
	c, err := h.cfg.Hub.Open(p, s)
	if err != nil { // draining since the check above; nobody else writes yet
		s.Write([]hub.Event{{Kind: hub.KindError, Code: hub.CodeShuttingDown, Message: "the node is shutting down; reconnect"}})
		return
	}
	defer c.Close()
	log := h.log.With("conn", c.ID, "tenant", p.TenantID)

	ctx, cancel := context.WithTimeout(r.Context(), h.cfg.SubscribeTimeout)
	rejected, err := c.Subscribe(ctx, sub)
	cancel()
	if err != nil && !errors.Is(err, context.Canceled) {
		log.Debug("subscribe ended", "err", err)
	}
	for _, rj := range rejected {
		c.Send(hub.Event{Kind: hub.KindError, Code: rj.Code, TaskID: rj.TaskID, ProjectID: rj.ProjectID, Message: rejectionMessage(rj.Code)})
	}
	select {
	case <-r.Context().Done():
	case <-s.done:
	}
}

func rejectionMessage(code string) string {
	switch code {
	case hub.CodeNotFound:
		return "no such task"
	case hub.CodeInvalidID:
		return "invalid id"
	case hub.CodeTooMany:
		return "too many subscriptions on this connection"
	case hub.CodeUnavailable:
		return "the current state could not be read; it will be sent when it changes"
	}
	return code
}

// sink writes events to one SSE response. The hub calls Write from one
// writer at a time; the fields below are owned by that writer.
type sink struct {
	w       http.ResponseWriter
	rc      *http.ResponseController
	timeout time.Duration
	retry   time.Duration

	versions map[string]int64 // delivered versions, for the id: cursor

	closeOnce sync.Once
	done      chan struct{} // closed when the hub ends the connection
}

var bufPool = sync.Pool{New: func() any { return new(bytes.Buffer) }}

func (s *sink) Write(events []hub.Event) error {
	b := bufPool.Get().(*bytes.Buffer)
	defer func() {
		if b.Cap() <= 64<<10 {
			b.Reset()
			bufPool.Put(b)
		}
	}()
	for i := range events {
		s.render(b, &events[i])
	}
	s.rc.SetWriteDeadline(time.Now().Add(s.timeout))
	if _, err := s.w.Write(b.Bytes()); err != nil {
		return err
	}
	return s.rc.Flush()
}

func (s *sink) render(b *bytes.Buffer, ev *hub.Event) {
	switch ev.Kind {
	case hub.KindTask:
		if s.versions == nil {
			s.versions = make(map[string]int64)
		}
		s.versions[ev.Snapshot.TaskID] = ev.Snapshot.Version
		b.WriteString("event: task\nid: ")
		b.Write(encodeCursor(b.AvailableBuffer(), s.versions, ev.Snapshot.TaskID))
		b.WriteString("\ndata: ")
		b.Write(ev.Snapshot.JSON())
		b.WriteString("\n\n")
	case hub.KindHello:
		b.WriteString("retry: ")
		b.WriteString(strconv.FormatInt(s.retry.Milliseconds(), 10))
		b.WriteString("\n")
		writeJSON(b, "hello", struct {
			ConnID      string `json:"conn_id"`
			Node        string `json:"node"`
			Mode        string `json:"mode"`
			HeartbeatMS int64  `json:"heartbeat_ms"`
		}{ev.ConnID, ev.Node, ev.Mode, ev.HeartbeatMS})
	case hub.KindMode:
		writeJSON(b, "mode", struct {
			Mode   string `json:"mode"`
			Reason string `json:"reason,omitempty"`
		}{ev.Mode, ev.Reason})
	case hub.KindError:
		writeJSON(b, "error", struct {
			Code      string `json:"code"`
			Message   string `json:"message,omitempty"`
			TaskID    string `json:"task_id,omitempty"`
			ProjectID string `json:"project_id,omitempty"`
		}{ev.Code, ev.Message, ev.TaskID, ev.ProjectID})
	case hub.KindHeartbeat:
		b.WriteString(": hb\n\n")
	case hub.KindReconnect:
		// EventSource waits retry ms before reconnecting once the stream ends.
		b.WriteString("retry: ")
		b.WriteString(strconv.Itoa(ev.AfterMS))
		b.WriteString("\n")
		writeJSON(b, "reconnect", struct {
			AfterMS int `json:"after_ms"`
		}{ev.AfterMS})
	}
}

func writeJSON(b *bytes.Buffer, event string, v any) {
	b.WriteString("event: ")
	b.WriteString(event)
	b.WriteString("\ndata: ")
	json.NewEncoder(b).Encode(v) // ends with the newline that closes the data line
	b.WriteString("\n")
}

func (s *sink) Closed(hub.CloseReason) {
	s.closeOnce.Do(func() { close(s.done) })
}
