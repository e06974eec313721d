// Package backlog writes to a socket without ever blocking the caller: what
// the socket cannot take at once is kept, and a goroutine of the writer's
// own writes it, ending when it is written, when the write timeout passes,
// or when the socket closes. It is how one client that stops reading costs
// only itself: the hub's shared writers hand it its bytes and move on.
package backlog

import (
	"net"
	"sync"
	"syscall"
	"time"
)

// Writer is an io.Writer over a net.Conn whose Write never waits for the
// peer. Use it as the only writer of the connection, and leave no write
// deadline on the connection: the non-blocking write honours it too.
type Writer struct {
	conn    net.Conn
	raw     syscall.RawConn // nil when the connection has no descriptor: tryWrite uses a short deadline
	writeFD func(fd uintptr) bool
	timeout time.Duration
	drained func(error)

	mu       sync.Mutex // guards the fields below
	pending  []byte     // accepted, not yet written; the drain goroutine's while draining
	draining bool       // a drain goroutine runs
	notify   bool       // call drained once the drain ends
	err      error      // sticky: the drain failed, every later Write fails
	try      attempt    // the write in progress, for writeFD
}

// attempt is one non-blocking write: what to write, how much was, and why
// it stopped.
type attempt struct {
	b   []byte
	n   int
	err error
}

// New returns a Writer for conn. A backlog that is not written within
// timeout of being handed to the drain goroutine fails the Writer and
// closes conn. drained is called from the drain goroutine: after a failure
// always, after success only when NotifyWhenDrained asked for it. It must
// not call back into the Writer's Write.
func New(conn net.Conn, timeout time.Duration, drained func(error)) *Writer {
	w := &Writer{conn: conn, timeout: timeout, drained: drained}
	if sc, ok := conn.(syscall.Conn); ok {
		if raw, err := sc.SyscallConn(); err == nil {
			w.raw = raw
			w.writeFD = w.writeOnce
		}
	}
	return w
}

// Write writes what the socket takes now and keeps the rest for the drain
// goroutine. It reports len(b) written unless an earlier drain failed or the
// socket refused the bytes outright.
func (w *Writer) Write(b []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.err != nil {
		return 0, w.err
	}
	if w.draining {
		w.pending = append(w.pending, b...)
		return len(b), nil
	}
	n, err := w.tryWrite(b)
	if err != nil {
		w.err = err
		return n, err
	}
	if n < len(b) {
		w.pending = append(w.pending[:0], b[n:]...)
		w.draining = true
		go w.drain()
	}
	return len(b), nil
}

// SetSendBuffer sets a TCP connection's socket send buffer (SO_SNDBUF),
// which bounds what the kernel holds for a peer that stopped reading
// before a Writer keeps the rest; n <= 0 leaves the kernel's autotuning.
func SetSendBuffer(conn net.Conn, n int) {
	if tc, ok := conn.(interface{ SetWriteBuffer(int) error }); ok && n > 0 {
		tc.SetWriteBuffer(n)
	}
}

// NotifyWhenDrained reports whether bytes are still waiting to be written;
// if so, drained is called once they are, or once writing them failed.
func (w *Writer) NotifyWhenDrained() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.draining {
		w.notify = true
	}
	return w.draining
}

// Backlog is the number of bytes waiting to be written.
func (w *Writer) Backlog() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.pending)
}

// drain writes the backlog with blocking writes, each batch of it bounded
// by the timeout: the same rule a blocking writer had, without holding
// anyone else's goroutine.
func (w *Writer) drain() {
	var spare []byte
	for {
		w.mu.Lock()
		b := w.pending
		if len(b) == 0 {
			// Cleared before the next Write can run: the non-blocking path
			// honours a deadline too, and this one may be about to pass.
			w.conn.SetWriteDeadline(time.Time{})
			w.draining = false
			notify := w.notify
			w.notify = false
			w.pending = nil // an idle connection keeps no buffer
			w.mu.Unlock()
			if notify {
				w.drained(nil)
			}
			return
		}
		w.pending = spare[:0] // what arrives while this batch is written
		w.mu.Unlock()

		w.conn.SetWriteDeadline(time.Now().Add(w.timeout))
		if _, err := w.conn.Write(b); err != nil {
			w.mu.Lock()
			w.err, w.pending, w.draining, w.notify = err, nil, false, false
			w.mu.Unlock()
			// Reported before the close, so the owner learns why the
			// connection ends before its reader sees it end.
			w.drained(err)
			w.conn.Close() // the stream is cut mid-message: nothing more can be written to it
			return
		}
		spare = b
	}
}
