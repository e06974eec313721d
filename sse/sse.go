// Package sse is the EventSource transport: GET /v1/events streams a
// connection's hello, task snapshots, mode changes, refusals and heartbeats
// as text/event-stream.
package sse

import (
	"context"
	"errors"
	"flag"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/pushd/pushd/hub"
	"github.com/pushd/pushd/internal/flagval"
	"github.com/pushd/pushd/internal/httperr"
	"github.com/pushd/pushd/snapshot"
	"github.com/pushd/pushd/stream/cursor"
)

// Path is the endpoint a node serves the event stream at
// (docs/PROTOCOL.md).
const Path = "/v1/events"

// Config configures a Handler; zero values have defaults. The limits
// every transport keeps (write timeout, send buffer, ids per request,
// subscribe timeout) are the Hub's (hub.Config).
type Config struct {
	Hub *hub.Hub // required
	// Retry is the base reconnect delay sent in the retry: field; each
	// connection adds up to 50 % jitter so a fleet's clients do not return
	// together. Zero means 2s.
	Retry time.Duration
	// CheckInterval is how often taken-over connections are checked for a
	// client that went away (one non-blocking peek per connection); between
	// checks, the next write notices. Zero means 5s.
	CheckInterval time.Duration
	// NoHijack keeps every connection in its handler goroutine, as HTTP/2
	// streams are; for comparison and debugging.
	NoHijack bool
	Logger   *slog.Logger // nil means slog.Default()
}

// Handler serves the EventSource stream. Close releases the connections it
// took over.
type Handler struct {
	cfg    Config
	limits hub.Config // the per-connection limits every transport keeps
	log    *slog.Logger
	reaper *reaper
}

// RegisterFlags defines on fs a flag for each setting of c an operator
// sets, bound to its field, with the field's value as its default: call it
// on a Config with its defaults (DefaultConfig or WithDefaults).
func (c *Config) RegisterFlags(fs *flag.FlagSet) {
	flagval.Duration(fs, &c.Retry, "sse-retry", "base SSE reconnect delay (each connection adds up to 50% jitter)")
}

// WithDefaults returns c with each zero setting that has a default set to
// it; it is the one place those defaults are written.
func (c Config) WithDefaults() Config {
	if c.Retry <= 0 {
		c.Retry = 2 * time.Second
	}
	if c.CheckInterval <= 0 {
		c.CheckInterval = 5 * time.Second
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

// New returns a Handler.
func New(cfg Config) *Handler {
	cfg = cfg.WithDefaults()
	h := &Handler{cfg: cfg, limits: cfg.Hub.Config(), log: cfg.Logger}
	h.reaper = newReaper(cfg.CheckInterval, cfg.Logger)
	return h
}

// Close closes every connection the handler took over and stops its
// goroutine. Call it after the hub was shut down or closed. It is
// idempotent.
func (h *Handler) Close() { h.reaper.close() }

var allowedParams = map[string]bool{
	"task": true, "project": true, "scope": true, "last_event_id": true, "access_token": true, "deltas": true, "cursor": true,
}

// cursorOwn is the value of the cursor parameter with which a client that
// keeps its own resume cursor asks that each event's id name only its own
// task's version (see encoder.own).
const cursorOwn = "own"

// ParseRequest reads the subscription of a /v1/events request. It returns a
// code and message for a 400 when the request is malformed.
func (h *Handler) ParseRequest(r *http.Request) (hub.Subscription, string, string) {
	var s hub.Subscription
	q := r.URL.Query()
	for k := range q {
		if !allowedParams[k] {
			return s, httperr.UnknownParameter, "unknown parameter " + httperr.Truncate(strconv.Quote(k), 64)
		}
	}
	// The ids outlive the request: as substrings of its URL they would keep
	// the whole request line, a browser's access_token included, for the
	// connection's life.
	s.Tasks = cloneAll(q["task"])
	s.Projects = cloneAll(q["project"])
	if code, msg := h.cfg.Hub.CheckIDs(s.Tasks, s.Projects); code != "" {
		return s, code, msg
	}
	switch scope := q["scope"]; {
	case len(scope) == 0:
	case len(scope) == 1 && scope[0] == "user":
		s.User = true
	default:
		return s, httperr.BadRequest, `scope must be "user"`
	}
	if d := q["deltas"]; len(d) > 1 || (len(d) == 1 && d[0] != snapshot.DeltasMerge) {
		return s, httperr.BadRequest, `deltas must be "` + snapshot.DeltasMerge + `"`
	}
	if c := q["cursor"]; len(c) > 1 || (len(c) == 1 && c[0] != cursorOwn) {
		return s, httperr.BadRequest, `cursor must be "` + cursorOwn + `"`
	}
	if len(s.Tasks) == 0 && len(s.Projects) == 0 && !s.User {
		return s, httperr.BadRequest, "subscribe to at least one task, project or scope=user"
	}
	lastID := r.Header.Get("Last-Event-ID")
	if lastID == "" {
		lastID = strings.Clone(q.Get("last_event_id")) // its ids are kept too
	}
	// A node with streams writes stream cursors, once it has them; the hub
	// replays the stream after one, or reads everything when it cannot. The
	// task=version cursors of a node without (or before) them still work,
	// so clients keep their place across a deploy either way.
	s.Cursors = true
	if !cursor.Is(lastID) {
		s.Since = parseCursor(lastID)
		return s, "", ""
	}
	// A stream cursor issued for another subscription, or without a
	// fingerprint, is not replayed from: the replay would skip every task
	// added since, which never moved though the client never had it. The
	// version it names of its own event's task is held either way.
	lastID, s.Since = cutOwnVersion(lastID)
	if c, fp, ok := cutFingerprint(lastID); ok && fp == fingerprint(s) {
		s.Resume = c
	} else {
		s.ResumeMismatch = true
	}
	return s, "", ""
}

// Serve streams to an authenticated client. The caller has authenticated p
// and checked the method. On HTTP/1.1 the connection is taken over after
// its headers and held by the hub with no goroutine of its own; HTTP/2
// streams, which cannot be taken over, keep the handler's goroutine.
func (h *Handler) Serve(w http.ResponseWriter, r *http.Request, p hub.Principal) {
	sub, code, msg := h.ParseRequest(r)
	if code != "" {
		httperr.Write(w, http.StatusBadRequest, code, msg)
		return
	}
	p.Transport = hub.TransportSSE
	p.Deltas = r.URL.Query().Get("deltas") == snapshot.DeltasMerge
	if h.cfg.Hub.Draining() || h.reaper.stopped() {
		const msg = "the node is shutting down; reconnect"
		if !h.Refuse(w, r, httperr.Draining, 0, msg) {
			httperr.Write(w, http.StatusServiceUnavailable, httperr.Draining, msg)
		}
		return
	}
	enc := h.newEncoder(sub, r.URL.Query().Get("cursor") == cursorOwn)
	if r.ProtoMajor == 1 && !h.cfg.NoHijack {
		head := responseHeadWith(w.Header()) // before the hijack, which drops w
		if conn, ok := hijack(w); ok {
			h.serveHijacked(conn, head, p, sub, enc)
			return
		}
	}
	h.serveParked(w, r, p, sub, enc)
}

// subscribe runs the connection's initial subscription and reports what
// was refused as error events.
func (h *Handler) subscribe(ctx context.Context, c *hub.Conn, sub hub.Subscription) {
	ctx, cancel := context.WithTimeout(ctx, h.limits.SubscribeTimeout)
	rejected, err := c.Subscribe(ctx, sub)
	cancel()
	if err != nil && !errors.Is(err, context.Canceled) {
		h.log.Debug("subscribe ended", "conn", c.ID, "tenant", c.TenantID, "err", err)
	}
	for _, rj := range rejected {
		c.Send(hub.Event{Kind: hub.KindError, Code: rj.Code, TaskID: rj.TaskID, ProjectID: rj.ProjectID, Message: rejectionMessage(rj.Code),
			RetryAfter: rj.RetryAfter, RetryAfterMS: rj.RetryAfterMS})
	}
}

// newEncoder returns the encoder of a new connection: its retry, its
// subscription's fingerprint, and the versions a resuming client holds, so
// its first cursor is complete; with own, ids that name their own task
// only.
func (h *Handler) newEncoder(sub hub.Subscription, own bool) encoder {
	e := encoder{retry: h.retry().Milliseconds(), fp: fingerprint(sub), own: own}
	if !own {
		e.resumeFrom(sub)
	}
	return e
}

func (h *Handler) retry() time.Duration { return jittered(h.cfg.Retry) }

// jittered is d plus up to half of it again, at random: every retry: the
// handler sends, so that clients told together do not return together, and
// none returns sooner than d.
func jittered(d time.Duration) time.Duration { return d + rand.N(d/2+1) }

// cloneAll replaces each string of ids with a copy of its own.
func cloneAll(ids []string) []string {
	for i, id := range ids {
		ids[i] = strings.Clone(id)
	}
	return ids
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
		return "the current state could not be read; it is read again and sent shortly"
	case hub.CodeRateLimitExceeded:
		return "too many subscriptions read for this user; subscribe again after retry_after seconds"
	}
	return code
}
