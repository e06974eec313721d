//go:build !linux

package sse

import "net"

// peerGone cannot peek without blocking here; the next write (heartbeats
// included) notices a client that went away.
func peerGone(net.Conn) bool { return false }
