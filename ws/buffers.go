package ws

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"sync"
	"syscall"
	"time"

	"github.com/pushd/pushd/internal/backlog"
)

// Buffer sizes of a WebSocket connection. net/http hands a hijacked
// connection a 4 KiB reader and a 4 KiB writer, which coder/websocket keeps
// for the connection's life, and an idle connection keeps both. A
// client's request is a few dozen bytes (a subscribe to its tasks) and
// arrives in one read; a larger one passes through in pieces, and one of
// more than the buffer is read straight into the message. The writer
// carries only the library's close frame (the sink writes its messages
// and control frames below it), and must hold it whole: see frameWriter.
const (
	readBufferSize  = 256
	writeBufferSize = 256
)

// maxControlFrame is a control frame's largest size from a server: a
// 2-byte header and at most 125 bytes of payload (RFC 6455 5.5).
const maxControlFrame = 2 + 125

// A writer smaller than a control frame would flush it in two pieces.
const _ = uint(writeBufferSize - maxControlFrame)

// smallBuffers gives coder/websocket smaller buffers when it hijacks the
// connection, puts the sink's gate under the library's reader, and the
// sink's frameWriter, over its backlog writer, under the library's writer,
// so no frame write ever waits for the peer. The handshake's response is
// written before Hijack returns, so that writer sees frames only. If the
// client already sent bytes past the handshake, the gate reads the
// original reader holding them first.
type smallBuffers struct {
	http.ResponseWriter
	sink *sink // its backlog writer is set by Hijack
}

func (s smallBuffers) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	conn, brw, err := http.NewResponseController(s.ResponseWriter).Hijack()
	if err != nil {
		return conn, brw, err
	}
	if brw.Writer.Buffered() > 0 {
		brw.Flush() // net/http wrote nothing of ours; be sure
	}
	backlog.SetSendBuffer(conn, s.sink.sendBuffer)
	s.sink.bw = backlog.New(conn, s.sink.timeout, s.sink.drained)
	s.sink.conn = conn
	s.sink.out.w = s.sink.bw
	g := &s.sink.g
	g.conn = conn
	if brw.Reader.Buffered() > 0 {
		g.pre = brw.Reader // the client's first bytes, sent with the handshake
	}
	if sc, ok := conn.(syscall.Conn); ok {
		if raw, err := sc.SyscallConn(); err == nil {
			s.sink.raw = raw
		}
	}
	s.sink.br = bufio.NewReaderSize(g, readBufferSize)
	// The library reads the connection it is handed, under its reader: it
	// must be the gate.
	return gatedConn{conn, g}, bufio.NewReadWriter(s.sink.br, bufio.NewWriterSize(&s.sink.out, writeBufferSize)), nil
}

// gatedConn is the hijacked connection as coder/websocket sees it: its
// reads go through the gate.
type gatedConn struct {
	net.Conn
	g *gate
}

func (c gatedConn) Read(p []byte) (int, error) { return c.g.Read(p) }

// Bounds of the wait in Close for a flooder's socket.
const (
	floodLinger      = time.Second
	floodLingerBytes = 1 << 20
)

// Close closes the socket. A flooder's is first shut for writing and read
// to its end, for at most floodLinger and floodLingerBytes: the gate stopped
// reading it, so its receive queue holds bytes, and closing a socket with
// unread bytes makes the kernel reset the connection, which can discard the
// close frame still on its way to the client.
func (c gatedConn) Close() error {
	if c.g.flooded() {
		if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok && cw.CloseWrite() == nil {
			c.Conn.SetReadDeadline(time.Now().Add(floodLinger))
			io.CopyN(io.Discard, c.Conn, floodLingerBytes)
		}
	}
	return c.Conn.Close()
}

// frameWriter is the one way frames reach the backlog writer, under
// coder/websocket's buffered writer. The library writes its close frame
// through it: it flushes after every frame, and control frames fit its
// buffer (maxControlFrame), so each of its writes here is one whole frame;
// the sink's pings and pongs come here whole too. The sink writes its data frames here itself, all the
// frames of one Write in one write: the library would take two locks and
// a write(2) per frame. A close frame seen going out ends the data frames,
// as the library's own writer would.
type frameWriter struct {
	mu        sync.Mutex
	w         io.Writer // the backlog writer
	closeSent bool
}

// errCloseSent is a data write after the close frame.
var errCloseSent = fmt.Errorf("websocket close frame sent: %w", net.ErrClosed)

// opClose is the close frame's opcode (RFC 6455 5.5.1).
const opClose = 0x8

// Write takes one flush of the library's buffered writer.
func (f *frameWriter) Write(p []byte) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(p) > 0 && p[0]&0x0f == opClose {
		f.closeSent = true
	}
	return f.w.Write(p)
}

// writeData writes the sink's frames (data, and its pings and pongs),
// unless the close frame went out first.
func (f *frameWriter) writeData(frames []byte) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closeSent {
		return errCloseSent
	}
	_, err := f.w.Write(frames) // the backlog writer copies what it keeps
	return err
}

// appendTextFrame appends p as one unmasked, uncompressed text frame: what
// a server sends when no extension was negotiated (pushd accepts none).
func appendTextFrame(b, p []byte) []byte {
	const finText = 0x80 | 0x1
	b = append(b, finText)
	switch n := len(p); {
	case n <= 125:
		b = append(b, byte(n))
	case n <= math.MaxUint16:
		b = append(b, 126)
		b = binary.BigEndian.AppendUint16(b, uint16(n))
	default:
		b = append(b, 127)
		b = binary.BigEndian.AppendUint64(b, uint64(n))
	}
	return append(b, p...)
}

// appendControlFrame appends a server's control frame of opcode op (ping or
// pong) carrying p, at most 125 bytes.
func appendControlFrame(b []byte, op byte, p []byte) []byte {
	b = append(b, 0x80|op, byte(len(p)))
	return append(b, p...)
}

// frameBuffers hold the frames of one Write: an idle connection keeps none.
var frameBuffers = sync.Pool{New: func() any { b := make([]byte, 0, 4<<10); return &b }}

// maxPooledFrames is the largest frame buffer kept for reuse; a larger one
// (a subscription's initial state) is left to the collector.
const maxPooledFrames = 256 << 10
