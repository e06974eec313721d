//go:build linux

package ws

import (
	"errors"
	"io"
	"os"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/pushd/pushd/ws/internal/wire"
)

// poller wakes parked connections when their sockets turn readable: one
// epoll set holds them all, each registered one-shot, so a parked
// connection costs an epoll entry and no goroutine. The set's own fd waits
// in the Go runtime's poller, like a socket: the poller's goroutine parks
// there, and wakes as any reader does, without a thread of its own
// blocked in epoll_wait. The sockets stay in the runtime's poller too, for
// the reads and writes made through net.Conn.
type poller struct {
	epfd int
	file *os.File        // epfd, for the runtime's poller
	raw  syscall.RawConn // file's

	mu     sync.Mutex
	conns  map[uint64]*sink // by the id each epoll entry carries
	nextID uint64
	closed bool
	done   chan struct{}
}

func newPoller() (*poller, error) {
	epfd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return nil, err
	}
	if err := unix.SetNonblock(epfd, true); err != nil {
		unix.Close(epfd)
		return nil, err
	}
	file := os.NewFile(uintptr(epfd), "epoll")
	raw, err := file.SyscallConn()
	if err != nil {
		file.Close()
		return nil, err
	}
	p := &poller{epfd: epfd, file: file, raw: raw, conns: make(map[uint64]*sink), done: make(chan struct{})}
	go p.loop()
	return p, nil
}

// arm asks for one wake of s when its socket is readable (or closed).
// Called under s.mu.
func (p *poller) arm(s *sink) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return errPollerClosed
	}
	op := unix.EPOLL_CTL_MOD
	if s.pollID == 0 {
		p.nextID++
		s.pollID = p.nextID
		op = unix.EPOLL_CTL_ADD
	}
	ev := unix.EpollEvent{Events: unix.EPOLLIN | unix.EPOLLRDHUP | unix.EPOLLONESHOT}
	setID(&ev, s.pollID)
	if err := s.onFD(func(fd int) error { return unix.EpollCtl(p.epfd, op, fd, &ev) }); err != nil {
		if op == unix.EPOLL_CTL_ADD {
			s.pollID = 0
		}
		return err
	}
	p.conns[s.pollID] = s
	return nil
}

// forget drops s's entry. A socket closed already left the epoll set by
// itself, and its number may be another connection's now: that one's
// entry must stay.
func (p *poller) forget(s *sink) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if s.pollID == 0 {
		return
	}
	delete(p.conns, s.pollID)
	if !p.closed {
		s.onFD(func(fd int) error { return unix.EpollCtl(p.epfd, unix.EPOLL_CTL_DEL, fd, nil) })
	}
	s.pollID = 0
}

// onFD runs f on s's socket while it is open: its number is the socket's
// for as long as f runs. A closed socket is an error, f not run.
func (s *sink) onFD(f func(fd int) error) error {
	var err error
	if cerr := s.raw.Control(func(fd uintptr) { err = f(int(fd)) }); cerr != nil {
		return cerr
	}
	return err
}

var errPollerClosed = errors.New("ws: poller closed")

func (p *poller) loop() {
	defer close(p.done)
	events := make([]unix.EpollEvent, 128)
	var woken []*sink
	for {
		n := 0
		var werr error
		err := p.raw.Read(func(fd uintptr) bool {
			n, werr = unix.EpollWait(int(fd), events, 0)
			return n > 0 || (werr != nil && !errors.Is(werr, unix.EINTR))
		})
		if err != nil || werr != nil {
			return // closed; or worse, and parked connections then end with the node
		}
		woken = woken[:0]
		p.mu.Lock()
		for _, ev := range events[:n] {
			if s := p.conns[eventID(&ev)]; s != nil {
				woken = append(woken, s)
			}
		}
		p.mu.Unlock()
		for i, s := range woken {
			s.wake()
			woken[i] = nil
		}
	}
}

// close stops the loop and closes the epoll set; connections still parked
// then never wake, so it comes after every one ended.
func (p *poller) close() {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return
	}
	p.closed = true
	p.mu.Unlock()
	p.file.Close() // ends the loop's wait
	<-p.done
}

// setID and eventID keep a 64-bit id in the event's data, which
// x/sys/unix splits in two 32-bit fields.
func setID(ev *unix.EpollEvent, id uint64) {
	ev.Fd = int32(uint32(id))
	ev.Pad = int32(uint32(id >> 32))
}

func eventID(ev *unix.EpollEvent) uint64 {
	return uint64(uint32(ev.Fd)) | uint64(uint32(ev.Pad))<<32
}

// readNow reads what s's socket holds without waiting: wire.ErrWouldBlock when
// it holds nothing, io.EOF once the client closed its end.
func (s *sink) readNow(b []byte) (n int, err error) {
	rerr := s.raw.Read(func(fd uintptr) bool {
		n, err = unix.Read(int(fd), b)
		return true // never wait for readability: that is the poller's job
	})
	switch {
	case rerr != nil:
		return 0, rerr
	case errors.Is(err, unix.EAGAIN), errors.Is(err, unix.EINTR):
		return 0, wire.ErrWouldBlock
	case err != nil:
		return 0, err
	case n == 0 && len(b) > 0:
		return 0, io.EOF
	}
	return n, nil
}
