//go:build linux

package ws

import (
	"errors"
	"io"
	"sync"

	"golang.org/x/sys/unix"
)

// poller wakes parked connections when their sockets turn readable: one
// goroutine waits in epoll_wait for all of them, each registered one-shot,
// so a parked connection costs an epoll entry and no goroutine. It watches
// the sockets beside the Go runtime's own poller, which keeps them for the
// reads and writes made through net.Conn.
type poller struct {
	epfd, wakefd int // wakefd: an eventfd that stops the loop

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
	wakefd, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		unix.Close(epfd)
		return nil, err
	}
	// Id 0 is the eventfd's; connections count from 1.
	if err := unix.EpollCtl(epfd, unix.EPOLL_CTL_ADD, wakefd, &unix.EpollEvent{Events: unix.EPOLLIN}); err != nil {
		unix.Close(epfd)
		unix.Close(wakefd)
		return nil, err
	}
	p := &poller{epfd: epfd, wakefd: wakefd, conns: make(map[uint64]*sink), done: make(chan struct{})}
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
		n, err := unix.EpollWait(p.epfd, events, -1)
		if err != nil {
			if errors.Is(err, unix.EINTR) {
				continue
			}
			return // EBADF after close, or worse: parked connections then end with the node
		}
		woken = woken[:0]
		stop := false
		p.mu.Lock()
		for _, ev := range events[:n] {
			id := eventID(&ev)
			if id == 0 {
				stop = true
				continue
			}
			if s := p.conns[id]; s != nil {
				woken = append(woken, s)
			}
		}
		p.mu.Unlock()
		for i, s := range woken {
			s.wake()
			woken[i] = nil
		}
		if stop {
			return
		}
	}
}

// close stops the loop and releases the epoll and event fds; connections
// still parked then never wake, so it comes after every one ended.
func (p *poller) close() {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return
	}
	p.closed = true
	p.mu.Unlock()
	one := []byte{1, 0, 0, 0, 0, 0, 0, 0}
	unix.Write(p.wakefd, one)
	<-p.done
	unix.Close(p.epfd)
	unix.Close(p.wakefd)
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

// readNow reads what s's socket holds without waiting: errWouldBlock when
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
		return 0, errWouldBlock
	case err != nil:
		return 0, err
	case n == 0 && len(b) > 0:
		return 0, io.EOF
	}
	return n, nil
}
