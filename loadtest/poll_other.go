//go:build !linux

package main

import (
	"errors"
	"net"
)

// poller does not exist outside Linux: newPoller returns nil and every
// established session is read by a goroutine of its own (readAlone).
type poller struct{}

type pconn struct{}

var errPollerClosed = errors.New("poller closed")

func newPoller() (*poller, error) { return nil, nil }

func (p *poller) close() {}

func (p *poller) serve(c *conn, nc net.Conn, closeConn func() error, early []byte, newFeeder func(*pconn) feeder, done func(error)) {
	panic("no poller outside Linux")
}

func (pc *pconn) Close() error               { return nil }
func (pc *pconn) write(frame []byte) error   { return nil }
func (pc *pconn) writeText(msg []byte) error { return nil }
