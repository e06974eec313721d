package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"
)

// conn is one client: it reads its stream, checks every version against the
// ones it saw, records latencies, and reconnects when the stream ends, as
// EventSource does (SSE with Last-Event-ID, WebSocket with "since").
type conn struct {
	w     *worker
	id    int
	task  int32
	token string
	ws    bool // WebSocket, else SSE
	slot  int  // index in w.conns, guarded by w.connsMu

	// Owned by whoever runs the connection now: a dialer during an
	// attempt, then the poller's loop (or, without a poller, the
	// session's reader) until the session ends; nobody while it is queued
	// or waits to reconnect, the queue or the timer handing it on.
	phys      int64       // the newest version on the current physical connection
	gotFirst  bool        // a task event arrived on the current physical connection
	dialStart int64       // Unix ns when the current physical connection was dialed
	cursor    []byte      // SSE: the last id: field, sent as Last-Event-ID
	first     func(error) // called once with the first attempt's outcome, then nil
	retries   int         // attempts failed since the last established stream

	node        atomic.Int32 // added to id to pick its node: a balancer moved it this far
	last        atomic.Int64 // the newest version seen, over reconnects
	convergedAt atomic.Int64 // Unix ns when it first held the expected version, 0 if not yet
	wakeJitter  atomic.Int64 // ns to wait after a wake before reconnecting
	firstAfter  atomic.Int64 // Unix ns of the first delivery published after the worker's since mark, 0 if none yet
	back        atomic.Int64 // Unix ns of the first task event on a physical connection dialed after the since mark, 0 if none yet
	status      atomic.Int32 // connState

	hold atomic.Pointer[holdCount] // what it received since the worker's hold mark; nil before one

	mu      sync.Mutex
	closing bool        // guarded by mu
	closer  io.Closer   // the current physical connection, guarded by mu
	backoff *time.Timer // armed while waiting to reconnect, guarded by mu
}

// holdCount is what one connection received after the hold mark: task
// events, and the resends among them (a version it held at the mark, or
// anything in the quiet window, when nothing is published).
type holdCount struct {
	held     int64        // the version it held at the mark
	reopened atomic.Int64 // Unix ns of its first handshake after the mark, 0 before one
	events   atomic.Int64
	resent   atomic.Int64
	quiet    atomic.Int64
}

// count notes a task event of version v received at recv (Unix ns);
// quietFrom is the worker's quiet mark, 0 for none.
func (h *holdCount) count(v, recv, quietFrom int64) {
	h.events.Add(1)
	inQuiet := quietFrom != 0 && recv >= quietFrom
	if inQuiet {
		h.quiet.Add(1)
	}
	if inQuiet || v <= h.held {
		h.resent.Add(1)
	}
}

type connState int32

const (
	stateDialing connState = iota
	stateOpen
	stateWaiting // waiting to reconnect
	stateClosed
)

func (c *conn) state() string {
	switch connState(c.status.Load()) {
	case stateDialing:
		return "dialing"
	case stateOpen:
		return "open"
	case stateWaiting:
		return "waiting to reconnect"
	}
	return "closed"
}

func (c *conn) target() int64 {
	p := c.w.targets.Load()
	if p == nil || int(c.task) >= len(*p) {
		return 0
	}
	return (*p)[c.task]
}

// setCloser records the physical connection so close can end it; it
// reports false when the client is closing, and then closes cl itself.
func (c *conn) setCloser(cl io.Closer) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closing {
		cl.Close()
		return false
	}
	c.closer = cl
	return true
}

func (c *conn) isClosing() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.closing
}

// statusError is a handshake the server refused.
// statusError is a refused handshake: its status and the Retry-After it
// named (0 for none).
type statusError struct {
	code       int
	retryAfter time.Duration
}

// refused is the statusError of resp, a refusal.
func refused(resp *http.Response) statusError {
	e := statusError{code: resp.StatusCode}
	if s, err := strconv.Atoi(resp.Header.Get("Retry-After")); err == nil && s > 0 {
		e.retryAfter = min(time.Duration(s)*time.Second, maxServerWait)
	}
	return e
}

// maxServerWait bounds a wait a server names, as pushd.js does.
const maxServerWait = 5 * time.Minute

func (e statusError) Error() string { return "status " + strconv.Itoa(e.code) }

func errKind(err error, established bool) string {
	var se statusError
	var ce centrifugoError
	switch {
	case err == nil || errors.Is(err, io.EOF):
		if established {
			return "stream_end"
		}
		return "eof_before_stream"
	case errors.As(err, &se):
		return "status_" + strconv.Itoa(se.code)
	case errors.As(err, &ce):
		return "centrifugo_error_" + strconv.FormatInt(ce.code, 10)
	case established:
		if code := websocket.CloseStatus(err); code != -1 {
			return "ws_close_" + strconv.Itoa(int(code))
		}
		return "stream_error"
	}
	return "dial_error"
}

// opened marks the first successful handshake of a physical connection.
func (c *conn) opened() {
	c.status.Store(int32(stateOpen))
	c.w.opened.Add(1)
	if h := c.hold.Load(); h != nil {
		h.reopened.CompareAndSwap(0, time.Now().UnixNano())
	}
	c.reportFirst(nil)
}

// onTask handles one task snapshot read at recv (Unix ns).
func (c *conn) onTask(data []byte, recv int64) {
	v, ok := jsonInt(data, `"version":`)
	if !ok {
		c.w.countErr("malformed_task")
		return
	}
	sent, ok := jsonInt(data, `"sent_ns":`)
	if !ok {
		// A snapshot pushd built from a PostgreSQL row carries no unknown
		// fields: fall back to updated_at, in ms.
		ms, _ := jsonInt(data, `"updated_at":`)
		sent = ms * 1_000_000
	}
	if v <= c.phys {
		c.w.regression(c, c.phys, v, "same connection")
	} else {
		c.phys = v
		switch last := c.last.Load(); {
		case v < last:
			c.w.regression(c, last, v, "after reconnect")
		case v == last:
			c.w.resumeRepeats.Add(1)
		default:
			c.last.Store(v)
		}
	}
	if h := c.hold.Load(); h != nil {
		h.count(v, recv, c.w.quiet.Load())
	}
	if ref := c.w.since.Load(); !c.gotFirst && ref != 0 && c.dialStart >= ref {
		c.back.CompareAndSwap(0, recv)
	}
	p := c.w.phase.Load()
	s := &p.shards[c.id%len(p.shards)]
	s.mu.Lock()
	s.deliveries++
	if !c.gotFirst {
		s.connects++
		recordUS(s.connect, recv-c.dialStart)
	}
	// A delivery's latency is a live update's, on a connection already
	// subscribed: a connection's first event is its initial state, however
	// recent, and times its connect (a client moved off a lost node would
	// otherwise charge its new node for the wait it spent reconnecting).
	live := c.gotFirst && sent >= c.dialStart
	if live {
		recordUS(s.latency, recv-sent)
		recordUS(s.byTransport[transportIndex(c.ws)], recv-sent)
	} else if sent < c.dialStart {
		s.catchUp++
	}
	s.mu.Unlock()
	// By node, only the clients that stayed on their connection across the
	// latest since mark (a node's loss): what a node's own clients
	// suffered, not the moved clients' first minutes on it.
	if ref := c.w.since.Load(); live && len(p.byNode) > 0 && (ref == 0 || c.dialStart < ref) {
		nh := &p.byNode[c.nodeIndex()]
		nh.mu.Lock()
		recordUS(nh.h, recv-sent)
		nh.mu.Unlock()
	}
	c.gotFirst = true
	if ref := c.w.since.Load(); ref != 0 && sent >= ref {
		c.firstAfter.CompareAndSwap(0, recv)
	}
	if t := c.target(); t > 0 && c.last.Load() >= t {
		c.convergedAt.CompareAndSwap(0, recv)
	}
}

func (c *conn) onMode(data []byte, recv int64) {
	if m, ok := jsonString(data, `"mode":"`); ok {
		c.w.sawMode(m, recv)
	}
}

func (c *conn) onError(data []byte) {
	code, _ := jsonString(data, `"code":"`)
	c.w.countErr("error_event_" + code)
}

// jsonInt reads the integer after key in a JSON document. The loadtest's
// own snapshots have each key once; pushd forwards them verbatim.
func jsonInt(b []byte, key string) (int64, bool) {
	i := bytes.Index(b, []byte(key))
	if i < 0 {
		return 0, false
	}
	b = b[i+len(key):]
	for len(b) > 0 && b[0] == ' ' {
		b = b[1:]
	}
	var n int64
	j := 0
	for ; j < len(b) && b[j] >= '0' && b[j] <= '9'; j++ {
		n = n*10 + int64(b[j]-'0')
	}
	return n, j > 0
}

func jsonString(b []byte, key string) (string, bool) {
	i := bytes.Index(b, []byte(key))
	if i < 0 {
		return "", false
	}
	b = b[i+len(key):]
	j := bytes.IndexByte(b, '"')
	if j < 0 {
		return "", false
	}
	return string(b[:j]), true
}

// nodeIndex is the node c dials now, in -nodes order.
func (c *conn) nodeIndex() int { return (c.id + int(c.node.Load())) % len(c.w.urls) }

func (c *conn) String() string { return fmt.Sprintf("conn %d (%s)", c.id, taskID(int(c.task))) }
