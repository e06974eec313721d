//go:build linux

package sse

import (
	"errors"
	"net"
	"syscall"
)

// peerGone reports whether the client closed or reset its end, with one
// non-blocking peek that never consumes data and never parks a goroutine.
func peerGone(c net.Conn) bool {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return false
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return true // closed already
	}
	gone := false
	err = raw.Read(func(fd uintptr) bool {
		var b [1]byte
		n, _, err := syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		switch {
		case err == nil:
			gone = n == 0 // 0 bytes: the client's FIN
		case errors.Is(err, syscall.EAGAIN), errors.Is(err, syscall.EINTR):
		default:
			gone = true // ECONNRESET and the like
		}
		return true // done: never wait for readability
	})
	return gone || err != nil
}
