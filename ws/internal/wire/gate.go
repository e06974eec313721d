package wire

import (
	"bufio"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
)

// gate sits between the socket and the library's reader. It takes the
// client's pings and pongs itself (control calls back for each) and hands
// every other frame (data, continuation, close, and anything malformed,
// for the library to refuse) through unchanged, a frame at a time. So the
// library's reader runs only while a message or a close is arriving, and
// between messages a connection can park with no goroutine of its own:
// pump, which never blocks, answers what arrives while it is parked.
type gate struct {
	mu   sync.Mutex // one reader at a time: the library's, or pump
	conn net.Conn
	pre  *bufio.Reader // bytes net/http read past the handshake, taken first; nil once empty
	// control takes a ping or pong's unmasked payload; false stops all
	// reading (a flood).
	control func(op byte, payload []byte) bool
	buf     [gateBufSize]byte
	r, w    int   // buf[r:w] is read and not yet taken
	pass    int64 // bytes of the frame being handed through still to go
	err     error // once set, every read fails with it
	// flood is set with err = errFlood. An atomic, read without mu: Read
	// holds mu through a blocking socket read, which only the Close that
	// asks is there to end.
	flood atomic.Bool
}

// gateBufSize holds a client's largest control frame whole: a 2-byte
// header, a 4-byte mask and 125 bytes of payload (RFC 6455 5.5). A data
// frame's header (at most 14 bytes) fits too.
const gateBufSize = 2 + 4 + 125

var errFlood = errors.New("control frames past the budget")

// Read hands the library the bytes of the frames it must see, reading the
// socket as they are needed; control frames in between are taken.
func (g *gate) Read(p []byte) (int, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for {
		if g.pass > 0 {
			p = p[:min(int64(len(p)), g.pass)]
			var n int
			if g.r < g.w {
				n = copy(p, g.buf[g.r:g.w])
				g.r += n
			} else {
				n, g.err = g.readSource(p)
			}
			g.pass -= int64(n)
			if n > 0 || g.err == nil {
				return n, nil
			}
		}
		if g.err != nil {
			return 0, g.err
		}
		if !g.step() {
			g.fill(g.readSource)
		}
	}
}

// pump reads what the socket holds without waiting and takes the control
// frames in it. It reports whether the library's reader is needed: a frame
// for it began, or the socket failed or closed.
func (g *gate) pump(readNow func([]byte) (int, error)) (busy bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for {
		if g.pass > 0 || g.err != nil {
			return true
		}
		if g.step() {
			continue
		}
		if g.pre != nil {
			g.fill(g.readSource) // buffered: it never waits
			continue
		}
		if !g.fill(readNow) {
			return false // nothing more to read now
		}
	}
}

// idle reports whether no frame for the library is under way: a
// connection may park. Part of a frame's head may be buffered (pump takes
// it up when the rest comes), so a client that sends half a frame and
// stops holds no goroutine either.
func (g *gate) idle() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.pass == 0 && g.pre == nil && g.err == nil
}

// flooded reports whether the gate stopped reading for a flood of control
// frames: the client may still be sending.
func (g *gate) flooded() bool { return g.flood.Load() }

// readSource reads the bytes net/http read past the handshake, then the
// connection.
func (g *gate) readSource(p []byte) (int, error) {
	if g.pre == nil {
		return g.conn.Read(p)
	}
	n, err := g.pre.Read(p)
	if g.pre.Buffered() == 0 {
		g.pre = nil
	}
	return n, err
}

// fill reads once into the buffer's free end, moving what is unread to its
// start first. It reports whether it read something; a read that would
// block (ErrWouldBlock) reads nothing and is no error.
func (g *gate) fill(read func([]byte) (int, error)) bool {
	if g.r > 0 {
		g.w = copy(g.buf[:], g.buf[g.r:g.w])
		g.r = 0
	}
	n, err := read(g.buf[g.w:])
	g.w += n
	switch {
	case errors.Is(err, ErrWouldBlock):
	case err != nil:
		g.err = err
	case n == 0 && len(g.buf[g.w:]) > 0:
		g.err = io.ErrNoProgress
	}
	return n > 0
}

// ErrWouldBlock is what Pump's reader returns when the socket holds
// nothing now.
var ErrWouldBlock = errors.New("websocket: nothing to read now")

// step decides the frame at the head of the buffer: a whole ping or pong
// is taken, the start of any other frame is let through. It reports
// whether it made progress; false means more bytes are needed.
func (g *gate) step() bool {
	b := g.buf[g.r:g.w]
	if len(b) < 2 {
		return false
	}
	fin, op, masked := b[0]&0x80 != 0, b[0]&0x0f, b[1]&0x80 != 0
	head := 2
	n := uint64(b[1] & 0x7f)
	switch n {
	case 126:
		head += 2
	case 127:
		head += 8
	}
	if masked {
		head += 4
	}
	if len(b) < head {
		return false
	}
	switch n {
	case 126:
		n = uint64(binary.BigEndian.Uint16(b[2:]))
	case 127:
		n = binary.BigEndian.Uint64(b[2:])
	}
	if (op == OpPing || op == OpPong) && fin && masked && n <= 125 {
		if len(b) < head+int(n) {
			return false
		}
		payload := b[head : head+int(n)]
		mask := b[head-4 : head]
		for i := range payload {
			payload[i] ^= mask[i%4]
		}
		g.r += head + int(n)
		if !g.control(op, payload) {
			g.err = errFlood
			g.flood.Store(true)
		}
		return true
	}
	// Anything else is the library's, malformed frames included: it
	// refuses them with the right close code. A length past any read
	// limit is cut short; the library ends the connection before then.
	g.pass = int64(head) + int64(min(n, 1<<62))
	return true
}
