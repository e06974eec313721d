package main

import (
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// readers are the two ways a worker reads its established streams: its
// poller, where the system has one, or a goroutine per session.
var readers = []string{"poller", "goroutine"}

// lifeWorker is a worker whose connections run as open and churn run
// them, against url, their streams read by reader. The test's cleanup
// shuts the worker down and then checks that nothing it started is left.
func lifeWorker(t *testing.T, url, reader string) *worker {
	t.Helper()
	ignore := goleak.IgnoreCurrent()
	w := testWorker(false)
	w.urls = []string{url}
	if reader == "poller" {
		p, err := newPoller()
		if err != nil {
			t.Fatal(err)
		}
		if p == nil {
			t.Skip("no poller on this system")
		}
		w.poller = p
	}
	t.Cleanup(func() {
		w.shutdown()
		goleak.VerifyNone(t, ignore)
	})
	return w
}

// lifeConn is connection id of w, watching task 3, over SSE.
func lifeConn(w *worker, id int) *conn {
	c := &conn{w: w, id: id, task: 3, token: "t"}
	w.connsMu.Lock()
	c.slot = len(w.conns)
	w.conns = append(w.conns, c)
	w.connsMu.Unlock()
	return c
}

// eventually polls cond until it holds; the deadline only ends a test that
// would hang.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("no %s within 10 s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// sseServer answers the nth request (from 1) with serve(n, rw, r), after
// a 200 head when serve does not write a status of its own.
func sseServer(t *testing.T, serve func(n int64, rw http.ResponseWriter, r *http.Request)) (*httptest.Server, *atomic.Int64) {
	t.Helper()
	var n atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		rw.Header().Set("Content-Type", "text/event-stream")
		serve(n.Add(1), rw, r)
	}))
	t.Cleanup(srv.Close) // after the worker's shutdown: cleanups run last first
	return srv, &n
}

func writeTask(rw http.ResponseWriter, v int) {
	fmt.Fprintf(rw, "event: task\nid: lt_3=%d\ndata: %s\n\n", v, taskJSON(v))
	rw.(http.Flusher).Flush()
}

// TestConnReconnects: a refused first attempt is the first outcome and
// waits a backoff; a stream that ends is reconnected at once, resuming
// from its cursor; every end is counted by its kind.
func TestConnReconnects(t *testing.T) {
	for _, reader := range readers {
		t.Run(reader, func(t *testing.T) {
			srv, requests := sseServer(t, func(n int64, rw http.ResponseWriter, r *http.Request) {
				switch n {
				case 1:
					rw.WriteHeader(http.StatusServiceUnavailable)
				case 2:
					writeTask(rw, 1) // and the stream ends
				default:
					if id := r.Header.Get("Last-Event-ID"); id != "lt_3=1" {
						t.Errorf("request %d resumes from %q, want lt_3=1", n, id)
					}
					writeTask(rw, 2)
					<-r.Context().Done()
				}
			})
			w := lifeWorker(t, srv.URL, reader)
			c := lifeConn(w, 0)
			first := make(chan error, 2)
			c.start(func(err error) { first <- err })
			if err := <-first; err == nil || err.Error() != "status 503" {
				t.Errorf("first outcome %v, want status 503", err)
			}
			eventually(t, "version 2", func() bool { return c.last.Load() == 2 })
			if n := requests.Load(); n != 3 {
				t.Errorf("%d requests, want 3", n)
			}
			w.errMu.Lock()
			errs := fmt.Sprint(w.errs)
			w.errMu.Unlock()
			if errs != "map[status_503:1 stream_end:1]" || w.reconnects.Load() != 2 || w.opened.Load() != 2 {
				t.Errorf("counted %s, %d reconnects, %d opened; want status_503 and stream_end once, 2 and 2", errs, w.reconnects.Load(), w.opened.Load())
			}
			if len(first) != 0 {
				t.Error("first called more than once")
			}
		})
	}
}

// TestDialPassesOverARefusingNode: a node that refuses connections (its
// process is gone) is passed over for another within the same attempt, as
// a balancer does, and the connection stays with the node that took it.
func TestDialPassesOverARefusingNode(t *testing.T) {
	srv, requests := sseServer(t, func(n int64, rw http.ResponseWriter, r *http.Request) {
		writeTask(rw, 1)
		<-r.Context().Done()
	})
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gone := "http://" + l.Addr().String()
	l.Close() // nothing listens there now: connections are refused
	w := lifeWorker(t, srv.URL, "goroutine")
	w.urls = []string{gone, gone, srv.URL}
	c := lifeConn(w, 0)
	first := make(chan error, 1)
	c.start(func(err error) { first <- err })
	if err := <-first; err != nil {
		t.Fatalf("first attempt: %v, want the live node's stream", err)
	}
	if c.nodeIndex() != 2 || requests.Load() != 1 {
		t.Fatalf("on node %d after %d requests, want node 2 after 1", c.nodeIndex(), requests.Load())
	}
	w.errMu.Lock()
	defer w.errMu.Unlock()
	if len(w.errs) != 0 {
		t.Fatalf("counted %v: a refusal the balancer passed over is no error", w.errs)
	}
}

// A refusal with Retry-After is retried after it, spread by at most a
// quarter; one without, and any other failure, backs off as pushd.js does.
func TestRetryDelayKeepsRetryAfter(t *testing.T) {
	rec := httptest.NewRecorder()
	rec.Header().Set("Retry-After", "2")
	rec.WriteHeader(http.StatusTooManyRequests)
	limited := refused(rec.Result())
	for range 100 {
		if d := retryDelay(limited, 0); d < 2*time.Second || d > 2500*time.Millisecond {
			t.Fatalf("after a 429 with Retry-After: 2, waits %v; want 2 s to 2.5 s", d)
		}
		if d := retryDelay(statusError{code: http.StatusServiceUnavailable}, 0); d < 0 || d > 500*time.Millisecond {
			t.Fatalf("after a 503 without Retry-After, waits %v; want the first backoff, 0 to 500 ms", d)
		}
		if d := retryDelay(statusError{code: http.StatusServiceUnavailable}, 20); d < 0 || d > 30*time.Second {
			t.Fatalf("after 21 failures, waits %v; want at most 30 s", d)
		}
	}
}

// silentServer accepts connections and never answers: an attempt to it
// waits in its handshake. accepted has the server's end of each.
func silentServer(t *testing.T) (url string, accepted <-chan net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ch := make(chan net.Conn, 256)
	done, stop := make(chan struct{}), make(chan struct{})
	go func() { // ends when the listener closes
		defer close(done)
		for {
			nc, err := ln.Accept()
			if err != nil {
				return
			}
			select {
			case ch <- nc:
			case <-stop: // nobody reads ch any more: more attempts than it holds
				nc.Close()
			}
		}
	}()
	t.Cleanup(func() {
		close(stop)
		ln.Close()
		<-done
		close(ch)
		for nc := range ch {
			nc.Close()
		}
	})
	return "http://" + ln.Addr().String(), ch
}

// TestConnClose ends a connection in each state, and the worker's shutdown
// one of each more: none is counted or reconnects, and no goroutine or
// timer is left running (lifeWorker's cleanup).
func TestConnClose(t *testing.T) {
	for _, reader := range readers {
		t.Run(reader, func(t *testing.T) {
			silent, accepted := silentServer(t)
			dialing := lifeWorker(t, silent, reader)
			srv, _ := sseServer(t, func(n int64, rw http.ResponseWriter, r *http.Request) {
				writeTask(rw, 1)
				<-r.Context().Done()
			})
			w := lifeWorker(t, srv.URL, reader)
			closed := func(c *conn) func() bool { return func() bool { return c.state() == "closed" } }

			c := lifeConn(dialing, 0)
			c.start(nil)
			(<-accepted).Close()
			c.close()
			eventually(t, "closed connection while dialing", closed(c))

			c = lifeConn(w, 0)
			c.start(nil)
			eventually(t, "version 1", func() bool { return c.last.Load() == 1 })
			c.close()
			eventually(t, "closed open connection", closed(c))

			c = lifeConn(w, 1)
			c.retryAfter(time.Hour)
			if s := c.state(); s != "waiting to reconnect" {
				t.Fatalf("state %s", s)
			}
			c.close()
			if s := c.state(); s != "closed" {
				t.Errorf("state %s after close while waiting, want closed", s)
			}

			c = lifeConn(w, 2)
			c.close()
			first := make(chan error, 1)
			c.start(func(err error) { first <- err })
			if err := <-first; err != nil {
				t.Errorf("first outcome %v of a connection closed before it, want none", err)
			}
			eventually(t, "closed connection, queued", closed(c))

			// Left to the shutdown: one open, one waiting, one dialing.
			open, waiting, dial := lifeConn(w, 3), lifeConn(w, 4), lifeConn(dialing, 1)
			open.start(nil)
			eventually(t, "version 1", func() bool { return open.last.Load() == 1 })
			waiting.retryAfter(time.Hour)
			dial.start(nil)
			<-accepted
			w.shutdown()
			dialing.shutdown()
			for _, c := range []*conn{open, waiting, dial} {
				if s := c.state(); s != "closed" {
					t.Errorf("conn %d: %s after the shutdown, want closed", c.id, s)
				}
			}
			if n := w.reconnects.Load() + dialing.reconnects.Load(); n != 0 {
				t.Errorf("%d reconnects of closed connections", n)
			}
		})
	}
}

// TestWake: a wake ends a backoff however long, at once or after the
// connection's jitter.
func TestWake(t *testing.T) {
	srv, _ := sseServer(t, func(n int64, rw http.ResponseWriter, r *http.Request) {
		writeTask(rw, 1)
		<-r.Context().Done()
	})
	w := lifeWorker(t, srv.URL, "poller")
	now, later := lifeConn(w, 0), lifeConn(w, 1)
	now.retryAfter(time.Hour)
	w.wakeAll(0)
	eventually(t, "a connection woken at once", func() bool { return now.last.Load() == 1 })
	later.retryAfter(time.Hour)
	w.wakeAll(time.Millisecond)
	eventually(t, "a connection woken after its jitter", func() bool { return later.last.Load() == 1 })
}

// TestDialQueueBound: attempts beyond the pool wait in the queue, not on
// goroutines of their own.
func TestDialQueueBound(t *testing.T) {
	silent, _ := silentServer(t)
	w := lifeWorker(t, silent, "poller")
	limit := dialersPerProc * runtime.GOMAXPROCS(0)
	for i := range limit + 50 {
		lifeConn(w, i).start(nil)
	}
	w.dialq.mu.Lock()
	running, queued := w.dialq.running, len(w.dialq.queue)
	w.dialq.mu.Unlock()
	if running != limit || queued < 50 {
		t.Errorf("%d dialers and %d attempts queued, want %d dialers and at least 50 queued", running, queued, limit)
	}
}
