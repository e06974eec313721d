// Package wire is the WebSocket connection under the ws transport, and the
// one place pushd relies on how coder/websocket works inside. The library
// does the handshake, reads messages and runs the close handshake; under
// it the connection takes the client's pings and pongs before the
// library's reader sees them (so an idle connection needs no reader),
// writes its own frames in one write per batch, and gives the library
// buffers a sixteenth of net/http's. What it relies on is listed at Accept
// and pinned by contract_test.go.
package wire

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/coder/websocket"
)

// Options configure Accept.
type Options struct {
	Subprotocol string // the one the client must offer
	// OriginPatterns lists the origins allowed besides the request's own
	// host (path.Match patterns); empty allows same-origin browsers and
	// clients that send no Origin.
	OriginPatterns []string
	ReadLimit      int64 // a longer message closes the connection with 1009
	// Compression accepts a client's offer of permessage-deflate, without
	// context takeover on either side (Compressed, Deflate).
	Compression bool
	// Control takes each ping or pong of the client (OpPing, OpPong) with
	// its unmasked payload; false stops all reading (a flood), and the
	// connection can only close. It runs under the reader's lock: it must
	// not read or close the connection.
	Control func(op byte, payload []byte) bool
	// Writer wraps the hijacked socket in the writer every frame goes
	// through, which must not wait for the peer. Nil writes to the socket.
	Writer func(net.Conn) io.Writer
}

// Conn is a WebSocket, made by Accept; its zero value is ready for it, so
// a connection's owner can hold it by value. Read may be called by one
// goroutine at a time, beside Pump and Idle; WriteFrames and Close from
// any.
type Conn struct {
	lib *websocket.Conn
	g   gate
	out frameWriter
	br  *bufio.Reader // the library's reader, over g
	// deflate: permessage-deflate was negotiated, without context
	// takeover.
	deflate bool
}

// ErrSubprotocol is Accept's error when the client did not offer the
// subprotocol; the connection was closed with 1008.
var ErrSubprotocol = errors.New("websocket: subprotocol not offered")

// Accept upgrades the request into c, once; on failure the client has
// been answered.
//
// What it relies on in coder/websocket (contract_test.go):
//   - the library keeps the bufio.ReadWriter that Hijack returns as its
//     reader and writer, and reads the connection it is handed only through
//     that reader: both lead to the gate;
//   - it writes nothing but its close frame (no message and no Ping is
//     written through it), flushes after each frame, and a control frame
//     fits the writer: each write reaching frameWriter is one whole frame;
//   - its reader stops at the end of a message, reading nothing past it;
//   - with compression, it answers permessage-deflate in the response's
//     Sec-WebSocket-Extensions with no context takeover on either side,
//     and inflates the client's compressed messages itself.
func (c *Conn) Accept(w http.ResponseWriter, r *http.Request, o Options) error {
	c.g.control = o.Control
	mode := websocket.CompressionDisabled
	if o.Compression {
		// Each message alone: one compressed once serves every
		// connection (Deflate), and a connection keeps no window.
		mode = websocket.CompressionNoContextTakeover
	}
	lib, err := websocket.Accept(hijacker{w, c, o.Writer}, r, &websocket.AcceptOptions{
		Subprotocols:    []string{o.Subprotocol},
		OriginPatterns:  o.OriginPatterns,
		CompressionMode: mode,
	})
	if err != nil {
		return err
	}
	c.lib = lib
	c.deflate = strings.HasPrefix(w.Header().Get("Sec-WebSocket-Extensions"), "permessage-deflate")
	if lib.Subprotocol() != o.Subprotocol {
		lib.Close(websocket.StatusPolicyViolation, "subprotocol "+o.Subprotocol+" required")
		return ErrSubprotocol
	}
	if o.ReadLimit > 0 {
		lib.SetReadLimit(o.ReadLimit)
	}
	return nil
}

// Read reads the next message, answering the pings and pongs before it.
// Pass a context that never ends: the library arms a watch on any other,
// and ends the connection without a close frame when it fires.
func (c *Conn) Read(ctx context.Context) (websocket.MessageType, []byte, error) {
	return c.lib.Read(ctx)
}

// WriteFrames writes frames built with AppendText and AppendControl in one
// write, unless the close frame went out first (an error wrapping
// net.ErrClosed).
func (c *Conn) WriteFrames(frames []byte) error { return c.out.writeData(frames) }

// Close runs the close handshake with code and reason: the close frame,
// then the client's, waited for at most the library's five seconds, then
// the socket closes.
func (c *Conn) Close(code websocket.StatusCode, reason string) error {
	return c.lib.Close(code, reason)
}

// CloseNow closes the socket without a close frame.
func (c *Conn) CloseNow() error { return c.lib.CloseNow() }

// Pump reads what the socket holds without waiting, through readNow (which
// returns ErrWouldBlock when nothing is there), and takes the pings and
// pongs in it. It reports whether a reader is needed: a message or a close
// began, or the socket failed or ended.
func (c *Conn) Pump(readNow func([]byte) (int, error)) (busy bool) { return c.g.pump(readNow) }

// Idle reports whether nothing for Read is under way or buffered: the
// connection may go without a reader until its socket turns readable.
func (c *Conn) Idle() bool { return c.g.idle() && c.br.Buffered() == 0 }

// Compressed reports whether the client takes compressed messages
// (AppendDeflated).
func (c *Conn) Compressed() bool { return c.deflate }

// Raw is the socket's descriptor for a poller; nil where there is none.
// Each call makes a new one: call it once.
func (c *Conn) Raw() syscall.RawConn {
	if sc, ok := c.g.conn.(syscall.Conn); ok {
		if raw, err := sc.SyscallConn(); err == nil {
			return raw
		}
	}
	return nil
}

// Buffer sizes of a connection. net/http hands a hijacked connection a
// 4 KiB reader and a 4 KiB writer, which the library keeps for the
// connection's life, and an idle connection keeps both. A client's request
// is a few dozen bytes (a subscribe to its tasks) and arrives in one read;
// a larger one passes through in pieces, and one of more than the buffer
// is read straight into the message. The writer carries only the
// library's close frame, and must hold it whole: see frameWriter.
const (
	readBufferSize  = 256
	writeBufferSize = 256
)

// A writer smaller than a control frame would flush it in two pieces.
const _ = uint(writeBufferSize - MaxControlFrame)

// hijacker gives the library the connection's own buffers when it hijacks
// the connection: the gate under its reader, and the frameWriter, over the
// Options' writer, under its writer. The handshake's response is written
// before Hijack returns, so that writer sees frames only. If the client
// already sent bytes past the handshake, the gate reads the original
// reader holding them first.
type hijacker struct {
	http.ResponseWriter
	c      *Conn
	writer func(net.Conn) io.Writer
}

func (h hijacker) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	conn, brw, err := http.NewResponseController(h.ResponseWriter).Hijack()
	if err != nil {
		return conn, brw, err
	}
	if brw.Writer.Buffered() > 0 {
		brw.Flush() // net/http wrote nothing of ours; be sure
	}
	c := h.c
	c.out.w = conn
	if h.writer != nil {
		c.out.w = h.writer(conn)
	}
	c.g.conn = conn
	if brw.Reader.Buffered() > 0 {
		c.g.pre = brw.Reader // the client's first bytes, sent with the handshake
	}
	c.br = bufio.NewReaderSize(&c.g, readBufferSize)
	// The library reads the connection it is handed, under its reader: it
	// must be the gate.
	return gatedConn{conn, &c.g}, bufio.NewReadWriter(c.br, bufio.NewWriterSize(&c.out, writeBufferSize)), nil
}

// gatedConn is the hijacked connection as the library sees it: its reads
// go through the gate.
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

// frameWriter is the one way frames reach the Options' writer. The library
// writes its close frame through it, under its buffered writer: it flushes
// after every frame, and a control frame fits its buffer
// (MaxControlFrame), so each of its writes here is one whole frame. The
// connection's own frames come here whole too, all the frames of one
// WriteFrames in one write: the library would take two locks and a
// write(2) per frame. A close frame seen going out ends the data frames,
// as the library's own writer would.
type frameWriter struct {
	mu        sync.Mutex
	w         io.Writer
	closeSent bool
}

// errCloseSent is a data write after the close frame.
var errCloseSent = fmt.Errorf("websocket close frame sent: %w", net.ErrClosed)

// Write takes one flush of the library's buffered writer.
func (f *frameWriter) Write(p []byte) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(p) > 0 && p[0]&0x0f == opClose {
		f.closeSent = true
	}
	return f.w.Write(p)
}

// writeData writes the connection's own frames, unless the close frame
// went out first.
func (f *frameWriter) writeData(frames []byte) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closeSent {
		return errCloseSent
	}
	_, err := f.w.Write(frames) // a backlog writer copies what it keeps
	return err
}
