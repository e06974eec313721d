package sse

import (
	"bytes"
	"context"
	"net/http"
	"sync"
	"time"

	"github.com/pushd/pushd/hub"
)

// serveParked streams from the handler's goroutine, which waits until the
// client or the hub ends the stream: the path of HTTP/2 streams. That
// goroutine is the stream's writer too: the hub's writers hand it rendered
// bytes and move on, so a stream whose client stopped reading holds only
// its own goroutine, never a shared writer.
func (h *Handler) serveParked(w http.ResponseWriter, r *http.Request, p hub.Principal, sub hub.Subscription, enc encoder) {
	rc := http.NewResponseController(w)
	hdr := w.Header()
	hdr.Set("Content-Type", "text/event-stream")
	hdr.Set("Cache-Control", "no-cache")
	hdr.Set("X-Accel-Buffering", "no") // nginx must not buffer the stream
	w.WriteHeader(http.StatusOK)
	rc.SetWriteDeadline(time.Now().Add(h.limits.WriteTimeout))
	if err := rc.Flush(); err != nil {
		return
	}
	s := &parkedSink{w: w, rc: rc, timeout: h.limits.WriteTimeout, enc: enc,
		work: make(chan *bytes.Buffer, 1), done: make(chan struct{})}
	c, err := h.cfg.Hub.Open(p, s)
	if err != nil { // draining since the check in Serve; nobody else writes yet
		b := getBuf()
		s.enc.render(b, []hub.Event{{Kind: hub.KindError, Code: hub.CodeShuttingDown, Message: "the node is shutting down; reconnect"}})
		s.write(b)
		return
	}
	// The initial reads run beside the writing, so the hello and the first
	// snapshots are not held back by the slowest read.
	ctx, cancel := context.WithCancel(r.Context())
	subscribed := make(chan struct{})
	go func() {
		defer close(subscribed)
		h.subscribe(ctx, c, sub)
	}()
	defer func() {
		c.Close()
		cancel()
		<-subscribed
	}()
	for {
		select {
		case b := <-s.work:
			c.Drained(s.write(b))
		case <-r.Context().Done():
			return
		case <-s.done:
			return
		}
	}
}

// parkedSink writes to a response its handler goroutine keeps open. Write
// renders and queues; the handler goroutine writes.
type parkedSink struct {
	w       http.ResponseWriter
	rc      *http.ResponseController
	timeout time.Duration
	enc     encoder            // owned by the hub's writer of the moment
	work    chan *bytes.Buffer // cap 1: the hub queues one write at a time, until Drained

	closeOnce sync.Once
	done      chan struct{} // closed when the hub ends the connection
}

func (s *parkedSink) Bind(*hub.Conn) {} // the handler goroutine holds the Conn

func (s *parkedSink) Write(events []hub.Event) (bool, error) {
	b := getBuf()
	s.enc.render(b, events)
	s.work <- b
	return true, nil
}

// write writes and flushes b under the write timeout, then recycles it.
func (s *parkedSink) write(b *bytes.Buffer) error {
	defer putBuf(b)
	s.rc.SetWriteDeadline(time.Now().Add(s.timeout))
	if _, err := s.w.Write(b.Bytes()); err != nil {
		return err
	}
	return s.rc.Flush()
}

func (s *parkedSink) Closed(hub.CloseReason) {
	s.closeOnce.Do(func() { close(s.done) })
}
