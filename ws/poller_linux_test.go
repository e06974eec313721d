package ws

import (
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/pushd/pushd/internal/testenv"
)

// A connection's socket closes (the library closes it as it answers a close
// frame) before the connection ends and leaves the poller; by then its
// number may be a new connection's, parked. The ending one's leaving must
// not drop the new one's entry.
func TestPollerForgetsOnlyItsOwnSocket(t *testing.T) {
	p, err := newPoller()
	if err != nil {
		t.Fatal(err)
	}
	defer p.close()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	pair := func() (dialed, accepted net.Conn) {
		d, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		a, err := ln.Accept()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { d.Close(); a.Close() })
		return d, a
	}
	fdOf := func(c net.Conn) (fd int) {
		raw, _ := c.(syscall.Conn).SyscallConn()
		raw.Control(func(u uintptr) { fd = int(u) })
		return fd
	}
	parkOn := func(c net.Conn) (*sink, chan struct{}) {
		raw, err := c.(syscall.Conn).SyscallConn()
		if err != nil {
			t.Fatal(err)
		}
		woke := make(chan struct{}, 1)
		s := &sink{raw: raw}
		s.run = func() { woke <- struct{}{} }
		s.mu.Lock()
		defer s.mu.Unlock()
		if err := p.arm(s); err != nil {
			t.Fatal(err)
		}
		s.parked = true
		return s, woke
	}

	aSock, aPeer := pair()
	reused := fdOf(aSock)
	a, _ := parkOn(aSock)
	aSock.Close()
	aPeer.Close()
	bDialed, bAccepted := pair() // the lowest free numbers: one of them is a's
	bSock, bPeer := bDialed, bAccepted
	if fdOf(bAccepted) == reused {
		bSock, bPeer = bAccepted, bDialed
	} else if fdOf(bDialed) != reused {
		t.Fatalf("the kernel gave fds %d and %d, not %d again: this test needs the number reused", fdOf(bDialed), fdOf(bAccepted), reused)
	}
	_, woke := parkOn(bSock)
	p.forget(a)
	if _, err := bPeer.Write([]byte{1}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-woke:
	case <-time.After(testenv.Wait):
		t.Fatal("the new connection never woke: the ended one's leaving dropped its entry")
	}
}
