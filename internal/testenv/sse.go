package testenv

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"
)

// SSEEvent is one dispatched Server-Sent Event. A comment line is
// reported as an event named "comment".
type SSEEvent struct {
	Event, ID, Data string
	Retry           int
}

// ReadSSE parses an event stream the way EventSource does, calling emit for
// each event, until r ends or fails.
func ReadSSE(r io.Reader, emit func(SSEEvent)) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	var ev SSEEvent
	var data []string
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "":
			if len(data) > 0 || ev.Event != "" || ev.Retry > 0 {
				ev.Data = strings.Join(data, "\n")
				emit(ev)
			}
			ev, data = SSEEvent{}, nil
		case strings.HasPrefix(line, ":"):
			emit(SSEEvent{Event: "comment", Data: line})
		default:
			field, value, _ := strings.Cut(line, ":")
			value = strings.TrimPrefix(value, " ")
			switch field {
			case "event":
				ev.Event = value
			case "id":
				ev.ID = value
			case "data":
				data = append(data, value)
			case "retry":
				ev.Retry, _ = strconv.Atoi(value)
			}
		}
	}
}

// SSEClient reads one event stream over a real socket, as EventSource
// would: its events arrive on a goroutine of its own, which Close (run at
// the test's end) stops and waits for.
type SSEClient struct {
	// The answer to the request. A client whose answer is not a 200 event
	// stream has no stream, and keeps the answer's body in Body.
	Status int
	Header http.Header
	Body   string

	events chan SSEEvent // closed when the stream ends
	cancel context.CancelFunc
	done   chan struct{}
}

// OpenSSE sends GET url through client (http.DefaultClient if nil) with
// the headers given as name, value pairs.
func OpenSSE(t testing.TB, client *http.Client, url string, header ...string) *SSEClient {
	t.Helper()
	if client == nil {
		client = http.DefaultClient
	}
	ctx, cancel := context.WithCancel(context.Background())
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := client.Do(req)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	c := &SSEClient{Status: resp.StatusCode, Header: resp.Header, events: make(chan SSEEvent, 1024), cancel: cancel, done: make(chan struct{})}
	if resp.StatusCode != http.StatusOK || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		cancel()
		c.Body = string(b)
		close(c.done)
		close(c.events)
		return c
	}
	go func() {
		defer close(c.done)
		defer close(c.events)
		defer resp.Body.Close()
		ReadSSE(resp.Body, func(ev SSEEvent) { c.events <- ev })
	}()
	t.Cleanup(c.Close)
	return c
}

// Close disconnects and waits for the reader.
func (c *SSEClient) Close() {
	c.cancel()
	<-c.done
}

// Events are the stream's events as they arrive, heartbeats and comments
// included; the channel is closed when the stream ends.
func (c *SSEClient) Events() <-chan SSEEvent { return c.events }

// NextOrEnd returns the next event other than a heartbeat (or a comment);
// ok is false when the stream ended first. It fails the test after Wait.
func (c *SSEClient) NextOrEnd(t testing.TB) (ev SSEEvent, ok bool) {
	t.Helper()
	timer := time.NewTimer(Wait)
	defer timer.Stop()
	for {
		select {
		case ev, ok := <-c.events:
			if ok && (ev.Event == "heartbeat" || ev.Event == "comment") {
				continue
			}
			return ev, ok
		case <-timer.C:
			t.Fatalf("no SSE event within %v", Wait)
		}
	}
}

// Next is NextOrEnd for a stream that must not end.
func (c *SSEClient) Next(t testing.TB) SSEEvent {
	t.Helper()
	ev, ok := c.NextOrEnd(t)
	if !ok {
		t.Fatal("SSE stream ended")
	}
	return ev
}

// NextOf returns the next event, which must be named name. The hello and
// mode events come whenever the node's mode changes, so they are skipped
// unless name is one of them.
func (c *SSEClient) NextOf(t testing.TB, name string) SSEEvent {
	t.Helper()
	for {
		ev, ok := c.NextOrEnd(t)
		if !ok {
			t.Fatalf("SSE stream ended, want event %q", name)
		}
		if ev.Event == name {
			return ev
		}
		if name != "hello" && name != "mode" && (ev.Event == "hello" || ev.Event == "mode") {
			continue
		}
		t.Fatalf("got event %q (%s), want %q", ev.Event, ev.Data, name)
	}
}

// Ended waits for the server to end the stream, reading past the events
// that come before its end.
func (c *SSEClient) Ended(t testing.TB) {
	t.Helper()
	timer := time.NewTimer(Wait)
	defer timer.Stop()
	select {
	case <-c.done:
	case <-timer.C:
		t.Fatalf("SSE stream not ended within %v", Wait)
	}
}
