package main

import (
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// poller reads the streams of a worker's established connections on one
// goroutine, from an epoll set of its own. With a goroutine blocked in a
// read per connection, every delivery cost a wake-up through Go's netpoller
// and the scheduler, and every connection a parked goroutine's stack; here
// a ready socket costs a read(2), the events of one epoll_wait are read one
// after the other, and a session's end is a call on the loop to the
// function serve was given.
type poller struct {
	epfd int
	wake int           // an eventfd in the set, written by close
	done chan struct{} // closed when loop has returned

	mu     sync.Mutex
	conns  map[int32]*pconn // by descriptor, guarded by mu
	closed bool             // guarded by mu
}

// pconn is one connection the poller reads. Its descriptor is a duplicate
// of the dialed socket's, whose net.Conn is closed, so Go's netpoller no
// longer watches it; only the loop reads, writes or closes it.
type pconn struct {
	fd   int
	f    feeder      // owned by the loop once added
	done func(error) // takes the session's end, called once by the loop
	w    *worker     // counts the bytes read; nil in tests of the poller alone

	mu   sync.Mutex
	gone bool // fd is closed, guarded by mu
}

var errPollerClosed = errors.New("poller closed")

// newPoller starts a poller; its owner ends it with close.
func newPoller() (*poller, error) {
	epfd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("epoll_create1: %w", err)
	}
	wake, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		unix.Close(epfd)
		return nil, fmt.Errorf("eventfd: %w", err)
	}
	if err := unix.EpollCtl(epfd, unix.EPOLL_CTL_ADD, wake, &unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(wake)}); err != nil {
		unix.Close(epfd)
		unix.Close(wake)
		return nil, fmt.Errorf("epoll_ctl: %w", err)
	}
	p := &poller{epfd: epfd, wake: wake, done: make(chan struct{}), conns: map[int32]*pconn{}}
	go p.loop()
	return p, nil
}

// close ends every session the poller still reads with errPollerClosed
// and waits for the loop to return. It may be called more than once.
func (p *poller) close() {
	p.mu.Lock()
	if !p.closed {
		p.closed = true
		var one [8]byte
		one[0] = 1 // an eventfd counter is host-endian; any non-zero value wakes it
		unix.Write(p.wake, one[:])
	}
	p.mu.Unlock()
	<-p.done
}

// serve hands c's established connection nc to the poller and returns.
// closeConn closes nc and whatever wraps it once the poller holds a
// descriptor of its own. early is what was read past the handshake, fed
// first; newFeeder builds the session's parser for pc. done takes what
// ended the session, once: on the loop, which it must not block, or before
// serve returns when the poller could not take nc. c's fields its runner
// owns belong to the poller until done is called.
func (p *poller) serve(c *conn, nc net.Conn, closeConn func() error, early []byte, newFeeder func(*pconn) feeder, done func(error)) {
	fd, err := dupConn(nc)
	closeConn()
	if err != nil {
		done(err)
		return
	}
	pc := &pconn{fd: fd, done: done, w: c.w}
	pc.f = newFeeder(pc)
	if len(early) > 0 {
		if err := pc.f.feed(early, time.Now().UnixNano()); err != nil {
			pc.release()
			done(err)
			return
		}
	}
	if !c.setCloser(pc) {
		pc.release()
		done(nil)
		return
	}
	if err := p.add(pc); err != nil {
		pc.release()
		done(err)
	}
}

// dupConn returns a non-blocking duplicate of nc's descriptor.
func dupConn(nc net.Conn) (int, error) {
	sc, ok := nc.(syscall.Conn)
	if !ok {
		return -1, fmt.Errorf("%T has no descriptor", nc)
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return -1, err
	}
	fd, derr := -1, error(nil)
	if err := rc.Control(func(s uintptr) { fd, derr = unix.FcntlInt(s, unix.F_DUPFD_CLOEXEC, 0) }); err != nil {
		return -1, err
	}
	if derr != nil {
		return -1, fmt.Errorf("dup: %w", derr)
	}
	return fd, nil // O_NONBLOCK belongs to the open file, which the duplicate shares
}

func (p *poller) add(pc *pconn) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return errPollerClosed
	}
	if err := unix.EpollCtl(p.epfd, unix.EPOLL_CTL_ADD, pc.fd, &unix.EpollEvent{Events: unix.EPOLLIN | unix.EPOLLRDHUP | unix.EPOLLET, Fd: int32(pc.fd)}); err != nil {
		return fmt.Errorf("epoll_ctl: %w", err)
	}
	p.conns[int32(pc.fd)] = pc
	return nil
}

func (p *poller) loop() {
	defer close(p.done)
	events := make([]unix.EpollEvent, 256)
	type readyConn struct {
		pc     *pconn
		closed bool // the peer closed or reset: read to the end of the stream
	}
	ready := make([]readyConn, 0, len(events))
	buf := make([]byte, 64<<10)
	for {
		n, err := unix.EpollWait(p.epfd, events, -1)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			p.shutdown(fmt.Errorf("epoll_wait: %w", err))
			return
		}
		stop := false
		ready = ready[:0]
		p.mu.Lock()
		for _, ev := range events[:n] {
			if int(ev.Fd) == p.wake {
				stop = p.closed
			} else if pc := p.conns[ev.Fd]; pc != nil {
				ready = append(ready, readyConn{pc, ev.Events&(unix.EPOLLRDHUP|unix.EPOLLHUP|unix.EPOLLERR) != 0})
			}
		}
		p.mu.Unlock()
		if stop {
			p.shutdown(errPollerClosed)
			return
		}
		for _, r := range ready {
			p.read(r.pc, buf, r.closed)
		}
	}
}

// read feeds what pc's socket holds to its parser, until a read returns
// less than buf: a stream socket is then empty, and its next bytes are a
// new edge. The end of the stream is no byte and makes no edge of its own
// once a read has taken the bytes before it, so when the peer has closed
// (EPOLLRDHUP, or a reset) read goes on to the end.
func (p *poller) read(pc *pconn, buf []byte, closed bool) {
	for {
		n, err := unix.Read(pc.fd, buf)
		switch {
		case err == unix.EINTR:
			continue
		case err == unix.EAGAIN:
			return
		case err != nil:
			p.end(pc, fmt.Errorf("read: %w", err))
			return
		case n == 0:
			p.end(pc, io.EOF)
			return
		}
		if pc.w != nil {
			pc.w.phase.Load().wire.Add(int64(n))
		}
		if err := pc.f.feed(buf[:n], time.Now().UnixNano()); err != nil {
			p.end(pc, err)
			return
		}
		if n < len(buf) && !closed {
			return
		}
	}
}

// end ends pc's session with err: the loop forgets it, closes its
// descriptor (which leaves the epoll set with it) and hands the end to
// done, which may start the connection's next attempt.
func (p *poller) end(pc *pconn, err error) {
	p.mu.Lock()
	delete(p.conns, int32(pc.fd))
	p.mu.Unlock()
	pc.release()
	pc.done(err)
}

// shutdown ends every session with err and releases the poller.
func (p *poller) shutdown(err error) {
	p.mu.Lock()
	p.closed = true
	conns := p.conns
	p.conns = map[int32]*pconn{}
	p.mu.Unlock()
	for _, pc := range conns {
		pc.release()
		pc.done(err)
	}
	unix.Close(p.epfd)
	unix.Close(p.wake)
}

// Close ends the session from any goroutine: shutdown(2) leaves the
// descriptor to the loop, which then reads the end of the stream. A
// descriptor the loop has closed may already be another socket's, so
// gone is checked under mu.
func (pc *pconn) Close() error {
	pc.mu.Lock()
	defer pc.mu.Unlock()
	if pc.gone {
		return nil
	}
	return unix.Shutdown(pc.fd, unix.SHUT_RDWR)
}

func (pc *pconn) release() {
	pc.mu.Lock()
	defer pc.mu.Unlock()
	if !pc.gone {
		pc.gone = true
		unix.Close(pc.fd)
	}
}

// write writes a frame from the goroutine that feeds pc. A client writes
// only pongs, tens of bytes into an empty send buffer: a write that does
// not take all of it ends the session.
func (pc *pconn) write(frame []byte) error {
	for {
		n, err := unix.Write(pc.fd, frame)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return fmt.Errorf("write: %w", err)
		}
		if n < len(frame) {
			return fmt.Errorf("write: %d of %d bytes", n, len(frame))
		}
		return nil
	}
}

// writeText writes msg as a text message.
func (pc *pconn) writeText(msg []byte) error {
	return pc.write(appendClientFrame(nil, opText, msg))
}
