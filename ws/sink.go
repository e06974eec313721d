package ws

import (
	"encoding/json"
	"io"
	"net"
	"sync"
	"syscall"
	"time"

	"github.com/coder/websocket"
	"golang.org/x/time/rate"

	"github.com/pushd/pushd/hub"
	"github.com/pushd/pushd/internal/backlog"
	"github.com/pushd/pushd/snapshot"
	"github.com/pushd/pushd/ws/internal/wire"
)

// sink writes events as JSON text frames (task messages compressed where
// the client negotiated it), and holds what a connection's readers share:
// each reads while requests arrive, and the connection parks between
// them. Write is called by one hub writer at a time.
type sink struct {
	wc      wire.Conn       // held by value: one object per connection
	bw      *backlog.Writer // every frame goes through it; made by wc's Accept
	hc      *hub.Conn       // set by Bind, before any write
	timeout time.Duration
	// sendBuffer is the socket send buffer the writer method sets; 0
	// leaves it.
	sendBuffer int

	// What the connection's readers share; one reads at a time. parkMu
	// is held while park reads beside the library: the close handshake,
	// which reads through the library, waits for it.
	parkMu sync.Mutex
	budget *rate.Limiter // the client's control frames
	limit  *rate.Limiter // the client's requests
	bad    int           // malformed or dropped requests in a row
	run    func()        // reads until the connection parks or ends
	finish func(error)   // ends the connection

	// How the poller knows the connection; raw is nil where it cannot park.
	poller *poller
	raw    syscall.RawConn
	pollID uint64 // the poller's, under its lock

	wg       sync.WaitGroup // closes and timers in flight; finish waits for them
	mu       sync.Mutex     // guards the fields below
	parked   bool           // no reader: the poller starts one
	first    *time.Timer    // until the first request
	pongWait *time.Timer    // until the pong of the ping in flight
	code     websocket.StatusCode
	reason   string
	ending   bool
}

// newSink returns the sink of a connection under cfg and the hub's
// per-connection limits.
func newSink(cfg Config, limits hub.Config) *sink {
	s := &sink{timeout: limits.WriteTimeout, sendBuffer: limits.SendBuffer,
		budget: rate.NewLimiter(rate.Limit(cfg.ControlFrames), int(2*cfg.ControlFrames)),
		limit:  rate.NewLimiter(rate.Limit(cfg.RequestRate), cfg.RequestBurst)}
	return s
}

// writer is wire.Options.Writer: the backlog writer every frame of the
// hijacked socket goes through.
func (s *sink) writer(conn net.Conn) io.Writer {
	backlog.SetSendBuffer(conn, s.sendBuffer)
	s.bw = backlog.New(conn, s.timeout, s.drained)
	return s.bw
}

func (s *sink) Bind(c *hub.Conn) { s.hc = c }

// park gives the connection up to the poller when nothing is arriving:
// pings and pongs already read are answered, nothing is half read, and the
// connection is not ending. It reports whether it parked; the caller then
// stops reading at once, as the poller may already have started the next
// reader.
func (s *sink) park() bool {
	if s.poller == nil || s.raw == nil {
		return false
	}
	s.parkMu.Lock()
	defer s.parkMu.Unlock()
	if s.isEnding() || s.wc.Pump(s.readNow) || !s.wc.Idle() {
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ending || s.poller.arm(s) != nil {
		return false
	}
	s.parked = true
	return true
}

func (s *sink) isEnding() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ending
}

// wake is the poller's: the parked connection's socket turned readable.
// What it holds is taken on the poller's goroutine, which never waits:
// pings and pongs are answered there and the connection parks again, and
// a reader starts only for a frame of the library's (or a socket's end).
func (s *sink) wake() {
	s.mu.Lock()
	parked := s.parked
	s.parked = false
	s.mu.Unlock()
	if parked && !s.park() {
		go s.run()
	}
}

// onControl is wire.Options.Control: it answers a client's ping and takes
// a pong, as long as the client keeps within its budget of control frames.
func (s *sink) onControl(op byte, payload []byte) bool {
	// The pong of the node's own ping in flight was asked for: it is not
	// the client's to budget, whatever the heartbeat interval.
	if op == wire.OpPong && s.stopPongWait() {
		return true
	}
	if !s.controlFrame(s.budget) {
		return false
	}
	if op == wire.OpPing {
		var b [wire.MaxControlFrame]byte
		s.wc.WriteFrames(wire.AppendControl(b[:0], wire.OpPong, payload)) // a failed write ends the connection through the reader
		return true
	}
	return true
}

// controlFrame takes a control frame from the connection's budget and
// reports whether it is answered; one past the budget ends the connection
// (nothing more is read: a flooder never answers the close frame,
// and the close handshake would read its flood for seconds).
func (s *sink) controlFrame(budget *rate.Limiter) bool {
	if budget.Allow() {
		return true
	}
	if s.hc != nil {
		s.hc.Flooded()
	}
	return false
}

// Write writes the events' frames to the socket in one write, with no
// deadline and no context timer: the backlog writer under it never waits
// for the peer, and bounds what it keeps with the write timeout instead.
func (s *sink) Write(events []hub.Event) (bool, error) {
	buf := frameBuffers.Get().(*[]byte)
	frames := (*buf)[:0]
	deflate := s.wc.Compressed()
	for i := range events {
		switch ev := &events[i]; {
		case ev.Kind == hub.KindHeartbeat:
			frames = s.appendHeartbeat(frames)
		case ev.Kind == hub.KindTask && deflate:
			frames = appendDeflated(frames, ev)
		default:
			if b, ok := render(ev); ok {
				frames = wire.AppendText(frames, b)
			}
		}
	}
	var err error
	if len(frames) > 0 {
		err = s.wc.WriteFrames(frames)
	}
	if cap(frames) <= maxPooledFrames {
		*buf = frames[:0]
		frameBuffers.Put(buf)
	}
	if err != nil {
		return false, err
	}
	return s.bw.NotifyWhenDrained(), nil
}

// drained runs on the backlog's goroutine once a queued write is done, or
// once writing a frame not the hub's (a pong, a close) failed.
func (s *sink) drained(err error) {
	if s.hc != nil {
		s.hc.Drained(err)
	}
}

// appendHeartbeat appends what an idle connection is sent: a heartbeat
// message, which a browser's WebSocket shows the page (it answers pings
// unseen), preceded by a protocol ping, which checks the peer: one ping at
// a time, and a peer that does not answer within the write timeout is
// closed. The pong is taken under the library's reader, so a parked
// connection answers without waking. An ending connection is sent neither.
func (s *sink) appendHeartbeat(frames []byte) []byte {
	s.mu.Lock()
	if s.ending {
		s.mu.Unlock()
		return frames
	}
	if s.pongWait == nil {
		s.wg.Add(1)
		s.pongWait = time.AfterFunc(s.timeout, s.pongLate)
		frames = wire.AppendControl(frames, wire.OpPing, nil)
	}
	s.mu.Unlock()
	return wire.AppendText(frames, heartbeatMessage)
}

// frameBuffers hold the frames of one Write: an idle connection keeps none.
var frameBuffers = sync.Pool{New: func() any { b := make([]byte, 0, 4<<10); return &b }}

// maxPooledFrames is the largest frame buffer kept for reuse; a larger one
// (a subscription's initial state) is left to the collector.
const maxPooledFrames = 256 << 10

// heartbeatMessage is the heartbeat's JSON, the same for every connection.
var heartbeatMessage = []byte(`{"type":"heartbeat"}`)

func (s *sink) pongLate() {
	defer s.wg.Done()
	s.mu.Lock()
	late := s.pongWait != nil
	s.pongWait = nil
	s.mu.Unlock()
	if late {
		s.closeWith(-1, "") // no close frame: the peer is not reading
	}
}

// Closed closes the WebSocket with the code for the hub's reason.
func (s *sink) Closed(r hub.CloseReason) {
	code, reason := closeForReason(r)
	s.closeWith(code, reason)
}

// closeWith closes the WebSocket with code, once; a negative code closes it
// without a close frame. The close handshake waits for the peer, so it
// runs in its own short-lived goroutine: Closed is called under the hub's
// locks and must not block. A parked connection has no reader to notice,
// so that goroutine ends it too.
func (s *sink) closeWith(code websocket.StatusCode, reason string) {
	s.mu.Lock()
	if s.ending {
		s.mu.Unlock()
		return
	}
	s.ending, s.code, s.reason = true, code, reason
	parked := s.parked
	s.parked = false
	s.mu.Unlock()
	if parked {
		go s.finish(errEnding)
		return
	}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		// A barrier, not a hold: a park that began before ending was set
		// finishes reading first, one after it reads nothing, and the
		// poller's goroutine (a wake parks) never waits out a handshake.
		s.parkMu.Lock()
		//lint:ignore SA2001 the empty critical section is the barrier
		s.parkMu.Unlock()
		if code >= 0 {
			s.wc.Close(code, reason)
		} else {
			s.wc.CloseNow()
		}
	}()
}

// stopFirst stops the first-request timer, if it still runs.
func (s *sink) stopFirst() { s.stopTimer(&s.first) }

// stopPongWait stops waiting for the pong of the ping in flight: it came,
// or the connection ends. It reports whether a ping was in flight.
func (s *sink) stopPongWait() bool { return s.stopTimer(&s.pongWait) }

// stopTimers stops the connection's timers, so finish need not wait them
// out.
func (s *sink) stopTimers() {
	s.stopFirst()
	s.stopPongWait()
}

// stopTimer stops the timer *t (a field under s.mu), if it still runs, and
// forgets it. It reports whether there was one.
func (s *sink) stopTimer(t **time.Timer) bool {
	s.mu.Lock()
	timer := *t
	*t = nil
	s.mu.Unlock()
	if timer != nil && timer.Stop() {
		s.wg.Done() // the timer's function will not run
	}
	return timer != nil
}

// ended reports the close code and reason the sink is closing with, if any.
func (s *sink) ended() (websocket.StatusCode, string, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.code, s.reason, s.ending
}

// taskFrame is the message carrying a snapshot, built once per version.
func taskFrame(s *snapshot.Snapshot) []byte {
	b := make([]byte, 0, len(s.JSON())+24)
	b = append(b, `{"type":"task","task":`...)
	b = append(b, s.JSON()...)
	return append(b, '}')
}

// patchFrame is the message carrying a patch, built once per patch:
// {"type":"patch","task_id":..,"base":..,"patch":{..}}.
func patchFrame(p *snapshot.Patch) []byte {
	b := make([]byte, 0, len(p.Event)+16)
	b = append(b, `{"type":"patch",`...)
	return append(b, p.Event[1:]...)
}

// appendDeflated appends a task event for a connection that takes
// compressed messages: compressed once per version (or patch) and shared,
// or as it is where compressing saves nothing.
func appendDeflated(frames []byte, ev *hub.Event) []byte {
	var deflated []byte
	if ev.Patch != nil {
		deflated = ev.Patch.Encoded(snapshot.PatchEncodingWebSocketDeflate, deflatedPatchFrame)
	} else {
		deflated = ev.Snapshot.Encoded(snapshot.EncodingWebSocketDeflate, deflatedTaskFrame)
	}
	if deflated == nil {
		b, _ := render(ev)
		return wire.AppendText(frames, b)
	}
	return wire.AppendDeflated(frames, deflated)
}

func deflatedTaskFrame(s *snapshot.Snapshot) []byte {
	return wire.Deflate(s.Encoded(snapshot.EncodingWebSocket, taskFrame))
}

func deflatedPatchFrame(p *snapshot.Patch) []byte {
	return wire.Deflate(p.Encoded(snapshot.PatchEncodingWebSocket, patchFrame))
}

// render encodes one server message; heartbeats are Write's
// (appendHeartbeat).
func render(ev *hub.Event) ([]byte, bool) {
	var v any
	switch ev.Kind {
	case hub.KindTask:
		if ev.Patch != nil {
			return ev.Patch.Encoded(snapshot.PatchEncodingWebSocket, patchFrame), true
		}
		return ev.Snapshot.Encoded(snapshot.EncodingWebSocket, taskFrame), true
	case hub.KindHello:
		v = struct {
			Type        string `json:"type"`
			ConnID      string `json:"conn_id"`
			Node        string `json:"node"`
			Mode        string `json:"mode"`
			Reason      string `json:"reason,omitempty"`
			HeartbeatMS int64  `json:"heartbeat_ms"`
		}{"hello", ev.ConnID, ev.Node, ev.Mode, ev.Reason, ev.HeartbeatMS}
	case hub.KindAck:
		rej := ev.Rejected
		if rej == nil {
			rej = []hub.Rejection{}
		}
		v = struct {
			Type     string          `json:"type"`
			ID       int64           `json:"id"`
			Rejected []hub.Rejection `json:"rejected"`
		}{"ack", ev.AckID, rej}
	case hub.KindMode:
		v = struct {
			Type   string `json:"type"`
			Mode   string `json:"mode"`
			Reason string `json:"reason,omitempty"`
		}{"mode", ev.Mode, ev.Reason}
	case hub.KindError:
		v = struct {
			Type         string `json:"type"`
			Code         string `json:"code"`
			Message      string `json:"message,omitempty"`
			TaskID       string `json:"task_id,omitempty"`
			ProjectID    string `json:"project_id,omitempty"`
			RetryAfter   int64  `json:"retry_after,omitempty"`
			RetryAfterMS int64  `json:"retry_after_ms,omitempty"`
		}{"error", ev.Code, ev.Message, ev.TaskID, ev.ProjectID, ev.RetryAfter, ev.RetryAfterMS}
	case hub.KindReconnect:
		v = struct {
			Type    string `json:"type"`
			AfterMS int    `json:"after_ms"`
		}{"reconnect", ev.AfterMS}
	default:
		return nil, false
	}
	b, _ := json.Marshal(v)
	return b, true
}
