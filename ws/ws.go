// Package ws is the WebSocket transport (subprotocol pushd.v1): clients
// subscribe and unsubscribe with JSON requests on one connection and receive
// snapshots, acks, mode changes and errors as JSON text frames. An idle
// connection parks with no goroutine of its own.
package ws

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/coder/websocket"

	"github.com/pushd/pushd/hub"
	"github.com/pushd/pushd/internal/flagval"
	"github.com/pushd/pushd/internal/httperr"
	"github.com/pushd/pushd/snapshot"
	"github.com/pushd/pushd/ws/internal/wire"
)

// Subprotocol is the only subprotocol pushd speaks.
const Subprotocol = "pushd.v1"

// Path is the endpoint a node serves WebSockets at (docs/PROTOCOL.md).
const Path = "/v1/ws"

// Close codes beyond RFC 6455's, in the application range.
const (
	StatusTokenExpired websocket.StatusCode = 4001 // reconnect with a fresh token
	StatusTokenRefused websocket.StatusCode = 4003 // a refresh's token was refused; reconnect with a good one
	StatusSlowClient   websocket.StatusCode = 4008 // writes timed out; reconnect and resync
)

// Config configures a Handler; zero values have defaults. The limits
// every transport keeps (write timeout, send buffer, ids per request,
// subscribe timeout) are the Hub's (hub.Config).
type Config struct {
	Hub *hub.Hub // required
	// OriginPatterns lists the origins allowed besides the request's own
	// host (path.Match patterns, as coder/websocket takes them). Empty
	// allows same-origin browsers only; non-browser clients send no Origin.
	OriginPatterns []string
	// ReadLimit bounds one client message; a larger one closes the
	// connection with 1009. Zero means 64 KiB.
	ReadLimit int64
	// MaxBadMessages is how many malformed requests in a row end the
	// connection with 1008; zero means 10.
	MaxBadMessages int
	// FirstRequestTimeout is how long a new connection may wait before its
	// first request (a subscribe, possibly empty); a connection that asks
	// for nothing is closed with 1008. Zero means 10s.
	FirstRequestTimeout time.Duration
	// RequestRate and RequestBurst bound a connection's requests (a token
	// bucket); a request over it is dropped with a rate_limit_exceeded error
	// saying when the bucket has room again, and MaxBadMessages of those in
	// a row close the connection with 1008.
	// Zero means 10 per second with bursts of 20.
	RequestRate  float64
	RequestBurst int
	// Compression compresses task messages (permessage-deflate, without
	// context takeover) for clients that offer it: each version is
	// compressed once and the bytes shared, and a connection keeps no
	// compression state. Other messages, and anything compressing would
	// not shrink, go uncompressed.
	Compression bool
	// ControlFrames bounds the control frames (pings and pongs) a client
	// may send per second, with bursts of twice that: every ping is
	// answered, so a flood of them costs the node a write each. One past it
	// is not answered and closes the connection with 1008. The pong of the
	// node's own heartbeat ping is not counted. Zero means 5.
	ControlFrames float64
	// Authenticate checks the token of a refresh request as the
	// connection's first token was checked, client being the connection's
	// address (hub.Principal.RemoteIP), whose failed authentications it
	// counts, and names the token's session (empty for a JWT), which the
	// connection answers to from then on. Its error is a *LimitedError (the
	// address failed too many: the token was not checked), or wraps
	// ErrTokenExpired, ErrUnavailable (the check could not be made: the
	// client may retry) or neither (an invalid token). Nil refuses every
	// refresh as unavailable.
	Authenticate func(ctx context.Context, client, token string) (p hub.Principal, session string, err error)
	Logger       *slog.Logger // nil means slog.Default()
}

// Errors Config.Authenticate wraps.
var (
	ErrTokenExpired = errors.New("ws: token expired")
	ErrUnavailable  = errors.New("ws: token check unavailable")
)

// A LimitedError is Config.Authenticate's refusal of a token it did not
// check: the connection's address failed too many authentications lately.
// The refresh is answered rate_limit_exceeded with Wait, and the
// connection goes on with its token.
type LimitedError struct{ Wait time.Duration }

func (e *LimitedError) Error() string { return "ws: too many failed authentications from this address" }

// Handler serves /v1/ws.
type Handler struct {
	cfg    Config
	limits hub.Config // the per-connection limits every transport keeps
	log    *slog.Logger
	wg     sync.WaitGroup // one per connection, from its open to its end

	mu     sync.Mutex
	closed bool    // Close was called: no new connection goroutines
	poller *poller // wakes parked connections; made by the first to park
	noPark bool    // the poller could not be made: every connection keeps its reader
}

// RegisterFlags defines on fs a flag for each setting of c an operator
// sets, bound to its field, with the field's value as its default: call it
// on a Config with its defaults (DefaultConfig or WithDefaults).
func (c *Config) RegisterFlags(fs *flag.FlagSet) {
	fs.Int64Var(&c.ReadLimit, "ws-max-message-bytes", c.ReadLimit, "longest WebSocket message a client may send; a longer one closes the connection with 1009")
	fs.Float64Var(&c.RequestRate, "ws-request-rate", c.RequestRate, "requests per second one WebSocket may send (token bucket refill); one over it is dropped with rate_limit_exceeded")
	fs.IntVar(&c.RequestBurst, "ws-request-burst", c.RequestBurst, "requests one WebSocket may send at once")
	fs.IntVar(&c.MaxBadMessages, "ws-max-bad-messages", c.MaxBadMessages, "malformed or dropped WebSocket requests in a row before the connection is closed with 1008")
	fs.BoolVar(&c.Compression, "ws-compression", c.Compression, "compress task messages for WebSocket clients that offer permessage-deflate, each version once for every connection; a connection whose client compresses its requests, as browsers do, then keeps about 5 KB more")
	fs.Float64Var(&c.ControlFrames, "ws-control-frames", c.ControlFrames, "control frames (pings and pongs) one WebSocket client may send per second, in bursts of twice that, not counting the pong of the node's heartbeat ping; one past it closes the connection with 1008")
	flagval.Duration(fs, &c.FirstRequestTimeout, "first-request-timeout", "how long a new WebSocket may wait before its first request; then it is closed with 1008")
}

// WithDefaults returns c with each zero setting that has a default set to
// it; it is the one place those defaults are written.
func (c Config) WithDefaults() Config {
	if c.ReadLimit <= 0 {
		c.ReadLimit = 64 << 10
	}
	if c.MaxBadMessages <= 0 {
		c.MaxBadMessages = 10
	}
	if c.FirstRequestTimeout <= 0 {
		c.FirstRequestTimeout = 10 * time.Second
	}
	if c.RequestRate <= 0 {
		c.RequestRate = 10
	}
	if c.RequestBurst <= 0 {
		c.RequestBurst = 20
	}
	if c.ControlFrames <= 0 {
		c.ControlFrames = 5
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

// New returns a Handler.
func New(cfg Config) *Handler {
	cfg = cfg.WithDefaults()
	return &Handler{cfg: cfg, limits: cfg.Hub.Config(), log: cfg.Logger}
}

// request is a client message.
type request struct {
	Op       string           `json:"op"`
	ID       int64            `json:"id"`
	Tasks    []string         `json:"tasks"`
	Projects []string         `json:"projects"`
	Scope    string           `json:"scope"`
	Since    map[string]int64 `json:"since"`
	Token    string           `json:"token"`
}

// Serve upgrades an authenticated request and runs the connection until the
// client or the hub ends it.
func (h *Handler) Serve(w http.ResponseWriter, r *http.Request, p hub.Principal) {
	if h.cfg.Hub.Draining() {
		httperr.Write(w, http.StatusServiceUnavailable, httperr.Draining, "the node is shutting down; reconnect")
		return
	}
	deltas := r.URL.Query()["deltas"]
	if len(deltas) > 1 || (len(deltas) == 1 && deltas[0] != snapshot.DeltasMerge) {
		httperr.Write(w, http.StatusBadRequest, httperr.BadRequest, `deltas must be "`+snapshot.DeltasMerge+`"`)
		return
	}
	p.Deltas = len(deltas) == 1
	s := newSink(h.cfg, h.limits)
	err := s.wc.Accept(w, r, wire.Options{
		Subprotocol:    Subprotocol,
		OriginPatterns: h.cfg.OriginPatterns,
		ReadLimit:      h.cfg.ReadLimit,
		Compression:    h.cfg.Compression,
		Control:        s.onControl,
		Writer:         s.writer,
	})
	if err != nil {
		return // the client was answered: 400 for a bad handshake (the API refused foreign origins before), 1008 without the subprotocol
	}
	s.raw = s.wc.Raw()
	p.Transport = hub.TransportWebSocket
	c, err := h.cfg.Hub.Open(p, s)
	if err != nil {
		s.wc.Close(websocket.StatusServiceRestart, "node shutting down")
		return
	}
	// The handler's goroutine returns, taking its stack (grown deep by the
	// HTTP and routing layers) with it. A reader reads the connection's
	// requests while any arrive, and between them the connection parks
	// with no goroutine: the poller starts a reader when the socket turns
	// readable. Writes come from the hub's writers, pings from its
	// heartbeats.
	h.mu.Lock()
	if h.closed { // the node is stopping
		h.mu.Unlock()
		c.Close()
		s.wc.Close(websocket.StatusGoingAway, "node stopping")
		return
	}
	h.wg.Add(1)
	s.poller = h.pollerLocked()
	h.mu.Unlock()
	s.run = func() { h.run(s) }
	s.finish = func(err error) { h.finish(s, err) }
	// A connection that never asks for anything would hold its socket and
	// buffers for nothing. A timer, not the first Read's context:
	// coder/websocket drops the connection without a close frame when a
	// read's context ends, and the client should learn why.
	s.mu.Lock()
	s.wg.Add(1)
	s.first = time.AfterFunc(h.cfg.FirstRequestTimeout, func() {
		defer s.wg.Done()
		s.closeWith(websocket.StatusPolicyViolation, "no request within "+h.cfg.FirstRequestTimeout.String())
	})
	s.mu.Unlock()
	go s.run()
}

// pollerLocked returns the poller, made at the first call; nil where
// connections cannot park. Called under h.mu.
func (h *Handler) pollerLocked() *poller {
	if h.poller == nil && !h.noPark {
		p, err := newPoller()
		if err != nil {
			h.noPark = true
			if !errors.Is(err, errors.ErrUnsupported) {
				h.log.Warn("websocket connections will not park: no poller", "err", err)
			}
			return nil
		}
		h.poller = p
	}
	return h.poller
}

// run reads the connection's requests until it parks or ends.
func (h *Handler) run(s *sink) {
	// Reads get a context that never ends: coder/websocket arms a watch on
	// a read's context for every read, and would drop the connection
	// without a close frame if it ended. The connection ends by closing it
	// instead.
	err := h.readLoop(context.Background(), s)
	if errors.Is(err, errParked) {
		return
	}
	h.finish(s, err)
}

// finish ends the connection: on the goroutine of its last reader, or of
// the close that found it parked.
func (h *Handler) finish(s *sink, err error) {
	defer h.wg.Done()
	s.stopTimers()
	s.hc.Close() // no hub writes after this returns
	code, reason := closeFor(err)
	if ecode, ereason, ended := s.ended(); ended {
		code, reason = ecode, ereason // the sink is closing it with this code
	}
	if code >= 0 {
		s.wc.Close(code, reason)
	}
	if s.poller != nil {
		s.poller.forget(s) // before the socket closes, whose number may be reused
	}
	s.wc.CloseNow()
	s.wg.Wait() // the close the hub asked for, and the timers' functions
}

// connLog is the logger of a connection's lines. It is made for each line:
// the few there are come from requests, and an idle connection keeps no
// logger of its own.
func (h *Handler) connLog(c *hub.Conn) *slog.Logger {
	return h.log.With("conn", c.ID, "tenant", c.TenantID)
}

// Close waits for every connection's goroutine and stops the poller of
// parked connections. Connections end when the hub ends them or their
// clients go, so call it after the hub's Shutdown or Close.
func (h *Handler) Close() {
	h.mu.Lock()
	h.closed = true
	h.mu.Unlock()
	h.wg.Wait()
	h.mu.Lock()
	p := h.poller
	h.mu.Unlock()
	if p != nil {
		p.close()
	}
}

// readLoop reads client requests until the connection fails, or parks
// it (errParked) when nothing is arriving. Its error chooses the close
// code. It stops the first-request timer at the first message.
func (h *Handler) readLoop(ctx context.Context, s *sink) error {
	for {
		if s.park() {
			return errParked
		}
		if s.isEnding() {
			// A close is under way, and its handshake reads the client's
			// answer: this reader starts no read beside it, and finish
			// closes with the sink's code at once.
			return errEnding
		}
		typ, data, err := s.wc.Read(ctx)
		if err != nil {
			return err
		}
		s.stopFirst()
		if typ != websocket.MessageText {
			return errBinary
		}
		if now := time.Now(); !s.limit.AllowN(now, 1) {
			// Dropped unread: a flood costs no decoding and no reads. The
			// wait is until the bucket holds a token again.
			s.bad++
			ms := httperr.RetryAfterMS(time.Duration((1 - s.limit.TokensAt(now)) / h.cfg.RequestRate * float64(time.Second)))
			s.hc.Send(hub.Event{Kind: hub.KindError, Code: httperr.RateLimitExceeded,
				Message:    fmt.Sprintf("at most %g requests per second; this one was dropped", h.cfg.RequestRate),
				RetryAfter: httperr.RetryAfterSeconds(ms), RetryAfterMS: ms})
			if s.bad >= h.cfg.MaxBadMessages {
				return errTooFast
			}
			continue
		}
		// Decoding and handling go deep (encoding/json, then Redis and
		// PostgreSQL for a subscribe); a short-lived goroutine takes that
		// stack, so the reader's stays small. The reader waits: requests
		// are handled in order.
		var stop error
		shallow(func() { stop = h.handle(ctx, data, s.hc, &s.bad) })
		if stop != nil {
			return stop
		}
	}
}

// handle decodes and carries out one request. A non-nil error ends the
// connection.
func (h *Handler) handle(ctx context.Context, data []byte, c *hub.Conn, bad *int) error {
	req, msg := h.parse(data)
	if msg != "" {
		*bad++
		c.Send(hub.Event{Kind: hub.KindError, Code: "bad_request", Message: msg})
		if *bad >= h.cfg.MaxBadMessages {
			return errTooManyBad
		}
		return nil
	}
	*bad = 0
	switch req.Op {
	case "subscribe":
		sctx, cancel := context.WithTimeout(ctx, h.limits.SubscribeTimeout)
		rejected, err := c.Subscribe(sctx, hub.Subscription{
			Tasks: req.Tasks, Projects: req.Projects, User: req.Scope == "user", Since: req.Since,
		})
		cancel()
		if err != nil {
			if errors.Is(err, hub.ErrClosed) || ctx.Err() != nil {
				return err
			}
			h.connLog(c).Debug("subscribe failed", "err", err)
			c.Send(hub.Event{Kind: hub.KindError, Code: hub.CodeUnavailable, Message: "subscribe failed; retry"})
			return nil
		}
		c.Send(hub.Event{Kind: hub.KindAck, AckID: req.ID, Rejected: rejected})
	case "unsubscribe":
		c.Unsubscribe(req.Tasks, req.Projects)
		c.Send(hub.Event{Kind: hub.KindAck, AckID: req.ID})
	case "refresh":
		h.refresh(ctx, c, req)
	}
	return nil
}

// refresh replaces the connection's token by the request's, checked as the
// first was: the connection then ends at the new token's expiry. A token
// refused, expired, or of another user or tenant ends the connection
// (4003) after an error saying why; a check that could not be made is an
// unavailable error, and one refused for the address's failed
// authentications a rate_limit_exceeded error: with either the connection
// goes on with its token.
func (h *Handler) refresh(ctx context.Context, c *hub.Conn, req request) {
	if h.cfg.Authenticate == nil {
		c.Send(hub.Event{Kind: hub.KindError, Code: hub.CodeUnavailable, Message: "this node cannot refresh tokens"})
		return
	}
	actx, cancel := context.WithTimeout(ctx, h.limits.SubscribeTimeout)
	p, session, err := h.cfg.Authenticate(actx, c.RemoteIP, req.Token)
	cancel()
	var limited *LimitedError
	switch {
	case errors.As(err, &limited):
		ms := httperr.RetryAfterMS(limited.Wait)
		c.Send(hub.Event{Kind: hub.KindError, Code: httperr.RateLimitExceeded,
			Message:    "too many failed authentications from this address; retry later",
			RetryAfter: httperr.RetryAfterSeconds(ms), RetryAfterMS: ms})
		return
	case errors.Is(err, ErrUnavailable):
		c.Send(hub.Event{Kind: hub.KindError, Code: hub.CodeUnavailable, Message: "the token could not be checked; retry"})
		return
	case errors.Is(err, ErrTokenExpired):
		c.RefuseToken(httperr.TokenExpired, "the refresh's token expired")
		return
	case err != nil:
		c.RefuseToken(httperr.Unauthorized, "invalid token")
		return
	}
	switch err := c.Refresh(p, session); {
	case errors.Is(err, hub.ErrOtherPrincipal):
		c.RefuseToken(httperr.Unauthorized, "the token is another user's or tenant's")
	case err == nil:
		c.Send(hub.Event{Kind: hub.KindAck, AckID: req.ID})
	}
}

// shallow runs f on a fresh goroutine and waits for it.
func shallow(f func()) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		f()
	}()
	<-done
}

var (
	errParked     = errors.New("parked")
	errEnding     = errors.New("closed by the node")
	errBinary     = errors.New("binary message")
	errTooManyBad = errors.New("too many malformed requests")
	errTooFast    = errors.New("requests too fast")
)

// parse decodes and validates a request; a non-empty msg says what is wrong.
func (h *Handler) parse(data []byte) (request, string) {
	var req request
	dec := json.NewDecoder(strings.NewReader(string(data)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		return req, "malformed request: " + trimJSONError(err)
	}
	if dec.More() {
		return req, "malformed request: one JSON object per message"
	}
	switch req.Op {
	case "subscribe", "unsubscribe":
		if req.Token != "" {
			return req, req.Op + " takes no token"
		}
	case "refresh":
		if req.Token == "" || len(req.Tasks)+len(req.Projects)+len(req.Since) > 0 || req.Scope != "" {
			return req, "refresh takes a token only"
		}
		return req, ""
	case "":
		return req, `"op" is required`
	default:
		return req, fmt.Sprintf("unknown op %q", httperr.Truncate(req.Op, 32))
	}
	if _, msg := h.cfg.Hub.CheckIDs(req.Tasks, req.Projects); msg != "" {
		return req, msg
	}
	if len(req.Since) > h.limits.MaxIDs {
		return req, fmt.Sprintf("at most %d versions in since", h.limits.MaxIDs)
	}
	for id := range req.Since {
		if !snapshot.ValidID(id) {
			return req, "invalid task id in since " + httperr.Truncate(strconv.Quote(id), 80)
		}
	}
	if req.Scope != "" && req.Scope != "user" {
		return req, `scope must be "user"`
	}
	if req.Op == "unsubscribe" && (len(req.Since) > 0 || req.Scope != "") {
		return req, "unsubscribe takes tasks and projects only"
	}
	return req, ""
}

func trimJSONError(err error) string {
	return httperr.Truncate(strings.TrimPrefix(err.Error(), "json: "), 120)
}

// closeFor picks the close code for a reader error; -1 means the connection
// is already closed and needs no close frame.
func closeFor(err error) (websocket.StatusCode, string) {
	switch {
	case errors.Is(err, errBinary):
		return websocket.StatusUnsupportedData, "text frames only"
	case errors.Is(err, errTooManyBad):
		return websocket.StatusPolicyViolation, "too many malformed requests"
	case errors.Is(err, errTooFast):
		return websocket.StatusPolicyViolation, "requests too fast"
	case errors.Is(err, websocket.ErrMessageTooBig):
		return -1, "" // coder/websocket closed it with 1009
	case websocket.CloseStatus(err) != -1:
		return -1, "" // the client closed
	}
	return websocket.StatusGoingAway, ""
}

func closeForReason(r hub.CloseReason) (websocket.StatusCode, string) {
	switch r {
	case hub.CloseWriteFailed:
		return StatusSlowClient, "slow client"
	case hub.CloseTokenExpired:
		return StatusTokenExpired, "token expired"
	case hub.CloseTokenRefused:
		return StatusTokenRefused, "token refused"
	case hub.CloseFlooded:
		return websocket.StatusPolicyViolation, "control frames too fast"
	case hub.CloseDraining:
		return websocket.StatusServiceRestart, "node restarting"
	}
	return websocket.StatusGoingAway, "closing"
}
