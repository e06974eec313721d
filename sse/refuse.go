package sse

import (
	"bytes"
	"mime"
	"net/http"
	"strings"
	"time"

	"github.com/pushd/pushd/internal/httperr"
)

// Refuse answers a request for the event stream that was refused before it
// streamed, when the refusal is one an EventSource must survive: an
// EventSource gives up for good on any answer but a 200 text/event-stream,
// so a refusal that will pass by itself (temporary) made by one
// (Accept: text/event-stream) is answered 200 with a retry: of the
// refusal's wait, jittered as every stream's retry: is, one error event
// whose data is the refusal's JSON body, and the end of the body. The
// EventSource then waits and reconnects by itself.
//
// Refuse reports whether it answered. It writes nothing and reports false
// for a refusal that keeps its status (a permanent one, or a request that
// did not ask for an event stream); the caller then answers as every
// endpoint does. Either way the refusal was counted and limited before.
//
// wait is what a 429 or a 503 with Retry-After tells the client; zero, for
// a refusal that carries none, means the handler's Retry.
func (h *Handler) Refuse(w http.ResponseWriter, r *http.Request, code string, wait time.Duration, message string) bool {
	if !temporary(code) || !acceptsEventStream(r) {
		return false
	}
	if wait <= 0 {
		wait = h.cfg.Retry
	}
	body := httperr.NewLimitBody(code, wait, message)
	retry := httperr.RetryAfterMS(jittered(time.Duration(body.RetryAfterMS) * time.Millisecond))

	hd := w.Header()
	hd.Set("Content-Type", "text/event-stream")
	hd.Set("Cache-Control", "no-store") // a refusal, unlike a stream, must never be replayed from a cache
	hd.Set("X-Accel-Buffering", "no")
	// As a stream's end: a client that reads an event stream to the
	// connection's close, not to Content-Length, is not left waiting.
	hd.Set("Connection", "close")
	hd.Del("Content-Length")
	hd.Del("Retry-After") // the stream's retry: says it; a 200 with Retry-After means nothing
	w.WriteHeader(http.StatusOK)
	var b bytes.Buffer
	writeRetry(&b, retry)
	writeJSON(&b, "error", body)
	w.Write(b.Bytes())
	return true
}

// temporary reports whether a refusal of code passes by itself, without the
// client changing its request: those an EventSource is told to retry.
// Decided by code, never by status, and listed one by one, so a new code
// keeps its status until someone decides it passes.
func temporary(code string) bool {
	switch code {
	case httperr.RateLimitExceeded, // a bucket refills, a window moves on
		httperr.TooManyConnections, // another of the user's, the tenant's or the address's connections closes
		httperr.OverCapacity,       // a connection of this node closes, or a balancer picks another node
		httperr.Draining,           // another node answers, or this one restarted
		httperr.Unavailable:        // the session store or the sources answer again
		return true
	}
	// Everything else needs another request: no token, a bad, expired or
	// refused one (an EventSource cannot change its URL's token; the page
	// must make a new one), a foreign origin, a malformed request, a bug.
	return false
}

// acceptsEventStream reports whether r asks for an event stream, as every
// EventSource does: any other client (curl without the header, the
// snapshot API's readers) keeps the status answers.
func acceptsEventStream(r *http.Request) bool {
	for _, v := range r.Header.Values("Accept") {
		for part := range strings.SplitSeq(v, ",") {
			if mt, _, err := mime.ParseMediaType(strings.TrimSpace(part)); err == nil && mt == "text/event-stream" {
				return true
			}
		}
	}
	return false
}
