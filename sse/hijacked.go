package sse

import (
	"context"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/pushd/pushd/hub"
	"github.com/pushd/pushd/internal/backlog"
)

// responseHead starts a stream on a taken-over HTTP/1.1 connection. With no
// length and no chunking, the body ends when the connection closes, which is
// how the stream ends anyway.
const responseHead = "HTTP/1.1 200 OK\r\n" +
	"Content-Type: text/event-stream\r\n" +
	"Cache-Control: no-cache\r\n" +
	"X-Accel-Buffering: no\r\n" + // nginx must not buffer the stream
	"Connection: close\r\n" +
	"\r\n"

// responseHeadWith is responseHead plus the headers already set on the
// response (CORS headers, by the API's middleware): a taken-over
// connection writes its head itself, and would drop them.
func responseHeadWith(set http.Header) string {
	if len(set) == 0 {
		return responseHead
	}
	var b strings.Builder
	b.WriteString(strings.TrimSuffix(responseHead, "\r\n"))
	for _, k := range slices.Sorted(maps.Keys(set)) {
		switch k {
		case "Content-Type", "Cache-Control", "X-Accel-Buffering", "Connection", "Content-Length", "Transfer-Encoding":
			continue // the stream's own
		}
		for _, v := range set[k] {
			if !strings.ContainsAny(v, "\r\n") {
				b.WriteString(k + ": " + v + "\r\n")
			}
		}
	}
	b.WriteString("\r\n")
	return b.String()
}

// hijack takes the connection over from net/http. The read and write
// buffers net/http hands back are dropped: an idle stream keeps no buffer.
func hijack(w http.ResponseWriter) (net.Conn, bool) {
	conn, brw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		return nil, false
	}
	if brw.Writer.Buffered() > 0 { // nothing of ours was written before; be sure
		brw.Flush()
	}
	return conn, true
}

// serveHijacked writes the head, registers the connection with the hub and
// the reaper, runs the initial subscription, and returns: from then on the
// connection has no goroutine. The hub's writers write to it; the reaper
// notices a client that went away and closes what the hub ends.
func (h *Handler) serveHijacked(conn net.Conn, head string, p hub.Principal, sub hub.Subscription, enc encoder) {
	backlog.SetSendBuffer(conn, h.limits.SendBuffer)
	conn.SetWriteDeadline(time.Now().Add(h.limits.WriteTimeout))
	if _, err := conn.Write([]byte(head)); err != nil {
		conn.Close()
		return
	}
	conn.SetWriteDeadline(time.Time{}) // the backlog writer bounds what follows; a deadline left here would cut it

	s := &hijackedSink{conn: conn, enc: enc, reaper: h.reaper}
	s.w = backlog.New(conn, h.limits.WriteTimeout, s.drained)
	c, err := h.cfg.Hub.Open(p, s)
	if err != nil {
		s.Write([]hub.Event{{Kind: hub.KindError, Code: hub.CodeShuttingDown, Message: "the node is shutting down; reconnect"}})
		conn.Close()
		return
	}
	if !h.reaper.add(s) { // the handler is closing
		conn.Close()
		c.Close()
		return
	}
	// The request's context ends when this handler returns; the initial
	// reads get a context of their own.
	h.subscribe(context.Background(), c, sub)
}

// hijackedSink writes to a taken-over connection. The hub calls Write from
// one writer at a time; enc belongs to that writer.
type hijackedSink struct {
	conn   net.Conn
	w      *backlog.Writer // every write after the head goes through it
	enc    encoder
	reaper *reaper
	hc     *hub.Conn // set by Bind, before any write

	released bool // guarded by reaper.mu: the hub ended it, maybe before add
}

func (s *hijackedSink) Write(events []hub.Event) (bool, error) {
	b := getBuf()
	defer putBuf(b)
	s.enc.render(b, events)
	if _, err := s.w.Write(b.Bytes()); err != nil {
		return false, err
	}
	return s.w.NotifyWhenDrained(), nil
}

func (s *hijackedSink) Bind(c *hub.Conn) { s.hc = c }

// drained runs on the backlog's goroutine once a queued write is done.
func (s *hijackedSink) drained(err error) { s.hc.Drained(err) }

// Closed hands the connection to the reaper, which closes it: Closed runs
// under the hub's locks and must not block.
func (s *hijackedSink) Closed(hub.CloseReason) { s.reaper.release(s) }

// reaper owns the taken-over connections: it closes those the hub ended,
// and checks all of them on an interval for a client that went away. One
// goroutine serves every connection of a Handler.
type reaper struct {
	interval time.Duration
	log      *slog.Logger
	wake     chan struct{} // cap 1
	done     chan struct{}
	finished chan struct{}
	once     sync.Once

	mu      sync.Mutex // guards the fields below
	conns   map[*hijackedSink]struct{}
	closing []*hijackedSink
	closed  bool
	started bool
}

func newReaper(interval time.Duration, log *slog.Logger) *reaper {
	return &reaper{
		interval: interval, log: log,
		wake: make(chan struct{}, 1), done: make(chan struct{}), finished: make(chan struct{}),
		conns: make(map[*hijackedSink]struct{}),
	}
}

// add registers a connection, starting the goroutine on first use; false
// means the reaper is closed.
func (r *reaper) add(s *hijackedSink) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed || s.released {
		return false
	}
	if !r.started {
		r.started = true
		go r.run()
	}
	r.conns[s] = struct{}{}
	return true
}

func (r *reaper) stopped() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.closed
}

// release queues a connection to be closed.
func (r *reaper) release(s *hijackedSink) {
	r.mu.Lock()
	s.released = true
	r.closing = append(r.closing, s)
	r.mu.Unlock()
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

func (r *reaper) run() {
	defer close(r.finished)
	t := time.NewTicker(r.interval)
	defer t.Stop()
	for {
		select {
		case <-r.wake:
			r.closeQueued()
		case <-t.C:
			r.check()
			r.closeQueued()
		case <-r.done:
			r.closeQueued()
			for _, s := range r.all() {
				r.closeOne(s)
			}
			return
		}
	}
}

// all returns the registered connections, so they are closed or checked
// without holding r.mu.
func (r *reaper) all() []*hijackedSink {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]*hijackedSink, 0, len(r.conns))
	for s := range r.conns {
		out = append(out, s)
	}
	return out
}

func (r *reaper) closeQueued() {
	r.mu.Lock()
	queued := r.closing
	r.closing = nil
	r.mu.Unlock()
	for _, s := range queued {
		r.closeOne(s)
	}
}

// closeOne closes the socket first, which ends a write in flight at once,
// then takes the connection out of the hub.
func (r *reaper) closeOne(s *hijackedSink) {
	r.mu.Lock()
	_, live := r.conns[s]
	delete(r.conns, s)
	r.mu.Unlock()
	if !live {
		return
	}
	s.conn.Close()
	s.hc.Close()
}

// check peeks at every connection without blocking; a client that closed
// or reset its end is closed here instead of at the next heartbeat.
func (r *reaper) check() {
	for _, s := range r.all() {
		if peerGone(s.conn) {
			r.closeOne(s)
		}
	}
}

// close closes every connection and waits for the goroutine. Idempotent.
func (r *reaper) close() {
	r.once.Do(func() {
		r.mu.Lock()
		r.closed = true
		started := r.started
		r.mu.Unlock()
		close(r.done)
		if started {
			<-r.finished
		}
	})
}
