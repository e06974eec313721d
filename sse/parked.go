package sse

import (
	"net/http"
	"sync"
	"time"

	"github.com/pushd/pushd/hub"
)

// serveParked streams from the handler's goroutine, which waits until the
// client or the hub ends the stream: the path of HTTP/2 streams.
func (h *Handler) serveParked(w http.ResponseWriter, r *http.Request, p hub.Principal, sub hub.Subscription) {
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
	s := &parkedSink{w: w, rc: rc, timeout: h.cfg.WriteTimeout, enc: encoder{retry: h.retry().Milliseconds()}, done: make(chan struct{})}
	c, err := h.cfg.Hub.Open(p, s)
	if err != nil { // draining since the check in Serve; nobody else writes yet
		s.Write([]hub.Event{{Kind: hub.KindError, Code: hub.CodeShuttingDown, Message: "the node is shutting down; reconnect"}})
		return
	}
	defer c.Close()
	h.subscribe(r.Context(), c, sub)
	select {
	case <-r.Context().Done():
	case <-s.done:
	}
}

// parkedSink writes to a response its handler goroutine keeps open. The
// hub calls Write from one writer at a time.
type parkedSink struct {
	w       http.ResponseWriter
	rc      *http.ResponseController
	timeout time.Duration
	enc     encoder // owned by the writer

	closeOnce sync.Once
	done      chan struct{} // closed when the hub ends the connection
}

func (s *parkedSink) Write(events []hub.Event) error {
	b := getBuf()
	defer putBuf(b)
	s.enc.render(b, events)
	s.rc.SetWriteDeadline(time.Now().Add(s.timeout))
	if _, err := s.w.Write(b.Bytes()); err != nil {
		return err
	}
	return s.rc.Flush()
}

func (s *parkedSink) Closed(hub.CloseReason) {
	s.closeOnce.Do(func() { close(s.done) })
}
