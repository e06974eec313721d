package web_test

import (
	"errors"
	"fmt"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/pushd/pushd/hub"
	"github.com/pushd/pushd/internal/httperr"
	"github.com/pushd/pushd/node"
)

// shownWhile counts the versions of task the page rendered while keep held.
func shownWhile(history []seen, keep func(seen) bool) int {
	n := 0
	for _, s := range history {
		if keep(s) {
			n++
		}
	}
	return n
}

func (p *page) waitMode(mode string) {
	p.t.Helper()
	p.wait("server mode "+mode, `document.getElementById('conn').dataset.serverMode === '`+mode+`' && document.getElementById('f-mode').dataset.mode === '`+mode+`'`)
}

// waitPill waits for the header's connection pill to show state and text.
func (p *page) waitPill(state, text string) {
	p.t.Helper()
	p.wait("the pill "+text, fmt.Sprintf(`document.getElementById('conn-pill').dataset.state === %q && document.getElementById('conn-pill-text').textContent === %q`, state, text))
}

// The node loses its bus and polls: the page says so, and its tasks keep
// moving; when the bus is back, the page says that too.
func TestServerPollingModeShownAndTasksKeepMoving(t *testing.T) {
	b := newBrowser(t)
	for _, transport := range transports {
		t.Run(transport, func(t *testing.T) {
			n := startNode(t, node.Config{Hub: hub.Config{PollInterval: 200 * time.Millisecond}}, node.ForTest(node.TestTuning{DemoStep: 150 * time.Millisecond}))
			p := b.tab(t)
			p.open(n.URL, "transport="+transport)
			p.waitMode("push")

			live := "Live · SSE"
			if transport == "ws" {
				live = "Live · WebSocket"
			}
			p.waitPill("streaming", live)

			task := p.start("image_to_video", false)
			// What the bus does when its subscription is lost.
			n.Hub().Lost(errors.New("test: bus lost"))
			p.waitMode("polling")
			// The stream holds, but the server polls: the header says so.
			p.waitPill("server-polling", "Polling (pubsub_down)")
			p.waitStatus(task, "SUCCEEDED")
			history := p.seen(task)
			if got := shownWhile(history, func(s seen) bool { return s.Mode == "polling" }); got < 3 {
				p.fatalf("%d versions shown while the server polled, want the task to keep moving: %+v", got, history)
			}
			if log := p.logText(); !regexpMatch(`Server switched to polling \(pubsub_down\)`, log) {
				p.fatalf("the activity log does not show the switch")
			}

			n.Hub().Restored()
			p.waitMode("push")
			p.waitConn("streaming", transport)
			p.waitPill("streaming", live)
		})
	}
}

// breaker stands in front of a node and, when told, fails its stream
// endpoints while the rest of the API works: a proxy that refuses
// long-lived responses (502), or one that buffers them.
type breaker struct {
	next http.Handler
	mode atomic.Int32 // breakNone, break502 or breakBuffer
	done chan struct{}
}

const (
	breakNone = iota
	break502
	breakBuffer
)

func (b *breaker) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	stream := r.URL.Path == "/v1/events" || r.URL.Path == "/v1/ws"
	switch mode := b.mode.Load(); {
	case !stream || mode == breakNone:
		b.next.ServeHTTP(w, r)
	case mode == break502:
		httperr.Write(w, http.StatusBadGateway, "bad_gateway", "upstream unavailable")
	case mode == breakBuffer && r.URL.Path == "/v1/events":
		// Headers go out; the body is held back, as a buffering proxy does.
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		w.(http.Flusher).Flush()
		select {
		case <-r.Context().Done():
		case <-b.done:
		}
	default:
		httperr.Write(w, http.StatusBadGateway, "bad_gateway", "upstream unavailable")
	}
}

func TestStreamEndpointFailingFallsBackToPollingAndBack(t *testing.T) {
	b := newBrowser(t)
	for _, tc := range []struct {
		name, transport string
		mode            int32
	}{
		{"sse-502", "sse", break502},
		{"ws-502", "ws", break502},
		{"sse-buffering", "sse", breakBuffer},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := startNode(t, node.Config{}, node.ForTest(node.TestTuning{DemoStep: 150 * time.Millisecond}))
			br := &breaker{next: n.Handler(), done: make(chan struct{})}
			base := serve(t, br)
			t.Cleanup(func() { close(br.done) }) // before serve's cleanup, which waits for handlers
			p := b.tab(t)
			p.open(base, "transport="+tc.transport+"&fallback_after=2&poll_ms=250&stream_retry_ms=1500&backoff_ms=100&hello_ms=1000")

			br.mode.Store(tc.mode)
			p.do("cut", chromedp.Click(chromedp.ID("cut")))
			p.waitConn("polling", tc.transport)
			p.waitPill("polling", "Polling over HTTP")
			task := p.start("text_to_video", false)
			p.waitStatus(task, "SUCCEEDED")
			history := p.seen(task)
			if got := shownWhile(history, func(s seen) bool { return s.Conn == "polling" }); got < 3 {
				p.fatalf("%d versions shown while polling, want the page to keep updating: %+v", got, history)
			}
			if polls := eval[int](p, `window.pushdDemo.client.stats.polls`); polls == 0 {
				p.fatalf("no polls")
			}

			br.mode.Store(breakNone)
			p.waitConn("streaming", tc.transport)
			if log := p.logText(); !regexpMatch(`Stream unavailable \(.*\): polling over HTTP`, log) || !regexpMatch(`Back to streaming`, log) {
				p.fatalf("the activity log does not show the fallback and the return")
			}
			task = p.start("text_to_video", false)
			p.waitStatus(task, "SUCCEEDED")
			if got := shownWhile(p.seen(task), func(s seen) bool { return s.Conn == "streaming" }); got < 3 {
				p.fatalf("%d versions of a new task shown while streaming again", got)
			}
		})
	}
}
