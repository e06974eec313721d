//go:build unix

package backlog

import "syscall"

// tryWrite writes what the socket's buffer takes now with non-blocking
// write(2) calls on the descriptor: no deadline to move, no wait.
func (w *Writer) tryWrite(b []byte) (int, error) {
	if w.raw == nil {
		return w.tryWriteDeadline(b)
	}
	w.try = attempt{b: b}
	err := w.raw.Write(w.writeFD)
	a := w.try
	w.try = attempt{}
	if err == nil {
		err = a.err
	}
	return a.n, err
}

// writeOnce is the RawConn.Write callback; a method value made once in New,
// so a write allocates nothing. It runs under w.mu.
func (w *Writer) writeOnce(fd uintptr) bool {
	a := &w.try
	for a.n < len(a.b) {
		m, err := syscall.Write(int(fd), a.b[a.n:])
		if m > 0 {
			a.n += m
		}
		switch err {
		case nil:
			if m <= 0 {
				return true
			}
		case syscall.EINTR:
		case syscall.EAGAIN:
			return true // full: the rest is the drain goroutine's
		default:
			a.err = err
			return true
		}
	}
	return true // never wait for writability here
}
