package main

import (
	"bytes"
	"compress/flate"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"strings"
	"sync"

	"github.com/coder/websocket"
)

// A feeder takes a stream's bytes as they arrive, in pieces of any size,
// and dispatches every event they complete. now is when the bytes were
// read (Unix ns). It returns an error when the stream is malformed or has
// ended for the protocol (a close frame, the last chunk); the session then
// ends with that error.
type feeder interface {
	feed(b []byte, now int64) error
}

// maxEvent bounds an SSE line, a chunk-size line and a WebSocket message,
// as the WebSocket read limit did.
const maxEvent = 1 << 20

var errTooLong = errors.New("event over 1 MiB")

// sseParser reads text/event-stream: only what the loadtest needs, event,
// id, data and comments, dispatched to its conn on a blank line. Between
// events it holds no buffer: an event's data is dispatched from the piece
// it was read in, and only what a piece cuts off is copied, and dropped
// once dispatched.
type sseParser struct {
	c        *conn
	line     []byte // the start of a line the last piece cut, else nil
	data     []byte // the event's data so far, nil between events
	borrowed bool   // data points into the piece being fed: copied before feed returns
	kind     sseKind
	hasData  bool
}

func (p *sseParser) feed(b []byte, now int64) error {
	for len(b) > 0 {
		i := bytes.IndexByte(b, '\n')
		if i < 0 {
			if len(p.line)+len(b) > maxEvent {
				return errTooLong
			}
			p.line = append(p.line, b...)
			break
		}
		line, borrowed := b[:i], true
		if len(p.line) > 0 {
			if len(p.line)+i > maxEvent {
				return errTooLong
			}
			// The joined line's array is never reused: data may keep it.
			line, borrowed, p.line = append(p.line, line...), false, nil
		}
		b = b[i+1:]
		if n := len(line); n > 0 && line[n-1] == '\r' {
			line = line[:n-1]
		}
		p.onLine(line, borrowed, now)
	}
	if p.borrowed {
		p.data, p.borrowed = bytes.Clone(p.data), false
	}
	return nil
}

// onLine reads one line; borrowed says it points into the piece being
// fed.
func (p *sseParser) onLine(line []byte, borrowed bool, now int64) {
	if len(line) == 0 { // dispatch
		if p.hasData {
			p.c.onSSE(p.kind, p.data, now)
		}
		p.data, p.borrowed, p.kind, p.hasData = nil, false, sseMessage, false
		return
	}
	if line[0] == ':' { // comment: heartbeat
		return
	}
	field, value := line, []byte(nil)
	if i := bytes.IndexByte(line, ':'); i >= 0 {
		field, value = line[:i], line[i+1:]
		if len(value) > 0 && value[0] == ' ' {
			value = value[1:]
		}
	}
	switch string(field) {
	case "event":
		switch string(value) {
		case "task", "patch": // a patch's first "version" is the one it makes
			p.kind = sseTask
		case "mode":
			p.kind = sseMode
		case "error":
			p.kind = sseError
		case "reconnect":
			p.kind = sseReconnect
		default:
			p.kind = sseOther
		}
	case "data":
		if p.hasData {
			// data's capacity ends at its length while it is not its own:
			// append copies it then.
			p.data = append(append(p.data, '\n'), value...)
			p.borrowed = false
		} else {
			p.data, p.borrowed = value[:len(value):len(value)], borrowed
		}
		p.hasData = true
	case "id":
		p.c.cursor = append(p.c.cursor[:0], value...)
	}
}

// dechunker undoes HTTP/1.1 chunked transfer coding (Centrifugo's uni_sse
// is served by net/http, which chunks a streamed body) and feeds the body to
// next. The last chunk ends the stream with io.EOF; trailers are not read.
type dechunker struct {
	next   feeder
	state  chunkState
	size   int64 // chunkSize: the size so far; chunkData: the bytes left
	digits int   // hex digits read in the size line
	ext    bool  // in a chunk extension, skipped
}

type chunkState int

const (
	chunkSize chunkState = iota // the size line, up to its '\n'
	chunkData
	chunkEnd // the CRLF after the data
)

func (d *dechunker) feed(b []byte, now int64) error {
	for len(b) > 0 {
		switch d.state {
		case chunkSize:
			c := b[0]
			b = b[1:]
			switch {
			case c == '\n':
				if d.digits == 0 {
					return errors.New("chunked: empty size line")
				}
				if d.size == 0 {
					return io.EOF
				}
				d.state, d.digits, d.ext = chunkData, 0, false
			case d.ext || c == '\r' || c == ' ' || c == '\t':
			case c == ';':
				d.ext = true
			default:
				v, ok := unhex(c)
				if !ok || d.digits == 15 {
					return fmt.Errorf("chunked: bad size byte %q", c)
				}
				d.size = d.size<<4 | int64(v)
				d.digits++
			}
		case chunkData:
			n := int(min(d.size, int64(len(b))))
			if err := d.next.feed(b[:n], now); err != nil {
				return err
			}
			b, d.size = b[n:], d.size-int64(n)
			if d.size == 0 {
				d.state = chunkEnd
			}
		case chunkEnd:
			c := b[0]
			b = b[1:]
			switch c {
			case '\r':
			case '\n':
				d.state = chunkSize
			default:
				return fmt.Errorf("chunked: %q after a chunk's data", c)
			}
		}
	}
	return nil
}

func unhex(c byte) (byte, bool) {
	switch {
	case '0' <= c && c <= '9':
		return c - '0', true
	case 'a' <= c && c <= 'f':
		return c - 'a' + 10, true
	case 'A' <= c && c <= 'F':
		return c - 'A' + 10, true
	}
	return 0, false
}

// WebSocket opcodes (RFC 6455, 5.2).
const (
	opContinuation = 0x0
	opText         = 0x1
	opBinary       = 0x2
	opClose        = 0x8
	opPing         = 0x9
	opPong         = 0xA
)

// wsParser reads the frames a server sends a client: unmasked, text
// messages possibly in fragments, pings answered with a pong through send,
// a close frame ending the stream with a websocket.CloseError, as
// coder/websocket reports it. The one extension is permessage-deflate
// without context takeover, when deflate says it was negotiated.
type wsParser struct {
	onMessage func(msg []byte, now int64) error
	send      func(frame []byte) error // writes a frame to the server
	deflate   bool                     // messages may come compressed

	hdr       [10]byte // the header being read
	hn        int      // bytes of hdr read
	inPayload bool     // reading the current frame's payload, not a header
	op        byte     // the current frame's opcode
	fin       bool
	remain    int64  // payload bytes left in the current frame
	msg       []byte // a data message cut by pieces or frames so far, else nil
	ctl       []byte // a control frame's payload so far, else nil
	frag      bool   // a fragmented message is open
	inflate   bool   // the open message is compressed
}

func (p *wsParser) feed(b []byte, now int64) error {
	for len(b) > 0 {
		if !p.inPayload {
			want := 2
			if p.hn >= 2 {
				want = p.hdrLen()
			}
			n := copy(p.hdr[p.hn:want], b)
			p.hn += n
			b = b[n:]
			if p.hn < want || p.hdrLen() > p.hn {
				continue // the rest of the header is in a later piece, or in b
			}
			if err := p.startFrame(); err != nil {
				return err
			}
			if p.remain == 0 {
				if err := p.endFrame(nil, now); err != nil {
					return err
				}
			}
			continue
		}
		n := int(min(p.remain, int64(len(b))))
		chunk := b[:n]
		b, p.remain = b[n:], p.remain-int64(n)
		switch {
		case p.op >= opClose:
			p.ctl = append(p.ctl, chunk...)
		case p.remain == 0 && p.fin && len(p.msg) == 0:
			// The whole message is in this piece: dispatch it in place.
			if err := p.endFrame(chunk, now); err != nil {
				return err
			}
			continue
		default:
			if len(p.msg)+n > maxEvent {
				return errTooLong
			}
			p.msg = append(p.msg, chunk...)
		}
		if p.remain == 0 {
			if err := p.endFrame(nil, now); err != nil {
				return err
			}
		}
	}
	return nil
}

// hdrLen is the length of the header whose first two bytes are in hdr.
func (p *wsParser) hdrLen() int {
	switch p.hdr[1] & 0x7f {
	case 126:
		return 4
	case 127:
		return 10
	}
	return 2
}

func (p *wsParser) startFrame() error {
	h := p.hdr[:p.hn]
	p.hn, p.inPayload = 0, true
	if h[1]&0x80 != 0 {
		return errors.New("websocket: masked frame from the server")
	}
	p.fin, p.op = h[0]&0x80 != 0, h[0]&0x0f
	// RSV1 marks a compressed message, on its first frame only.
	compressed := h[0]&0x70 == 0x40 && p.deflate && (p.op == opText || p.op == opBinary)
	if h[0]&0x70 != 0 && !compressed {
		return errors.New("websocket: reserved bits set")
	}
	switch n := h[1] & 0x7f; n {
	case 126:
		p.remain = int64(binary.BigEndian.Uint16(h[2:4]))
	case 127:
		p.remain = int64(binary.BigEndian.Uint64(h[2:10]))
	default:
		p.remain = int64(n)
	}
	switch p.op {
	case opClose, opPing, opPong:
		if !p.fin || p.remain > 125 {
			return errors.New("websocket: bad control frame")
		}
		p.ctl = nil
	case opText, opBinary:
		if p.frag {
			return errors.New("websocket: new message inside a fragmented one")
		}
		p.frag = !p.fin
		p.inflate = compressed
	case opContinuation:
		if !p.frag {
			return errors.New("websocket: continuation without a message")
		}
		p.frag = !p.fin
	default:
		return fmt.Errorf("websocket: opcode %d", p.op)
	}
	if p.remain > maxEvent {
		return errTooLong
	}
	return nil
}

// endFrame acts on a frame whose payload has all been read: whole, when
// the payload is a whole message read in one piece, else in msg or ctl.
// Buffers are dropped once used: an idle connection holds none.
func (p *wsParser) endFrame(whole []byte, now int64) error {
	p.inPayload = false
	ctl := p.ctl
	p.ctl = nil
	switch p.op {
	case opClose:
		ce := websocket.CloseError{Code: websocket.StatusNoStatusRcvd}
		if len(ctl) >= 2 {
			ce.Code = websocket.StatusCode(binary.BigEndian.Uint16(ctl))
			ce.Reason = string(ctl[2:])
		}
		return ce
	case opPing:
		return p.send(appendClientFrame(nil, opPong, ctl))
	case opPong:
		return nil
	}
	if !p.fin {
		return nil
	}
	msg := whole
	if msg == nil {
		msg = p.msg
	}
	p.msg = nil
	if p.inflate {
		var err error
		if msg, err = inflate(msg); err != nil {
			return err
		}
	}
	return p.onMessage(msg, now)
}

// inflaters are the decompressors of compressed messages, shared: one is
// tens of kilobytes, too much to keep per connection.
var inflaters sync.Pool

// deflateTail ends a compressed message; the server leaves it off the
// wire (RFC 7692 7.2.2).
const deflateTail = "\x00\x00\xff\xff"

// inflate returns the message compressed in p.
func inflate(p []byte) ([]byte, error) {
	src := io.MultiReader(bytes.NewReader(p), strings.NewReader(deflateTail))
	r, _ := inflaters.Get().(io.ReadCloser)
	if r == nil {
		r = flate.NewReader(src)
	} else if err := r.(flate.Resetter).Reset(src, nil); err != nil {
		return nil, err
	}
	defer inflaters.Put(r)
	msg, err := io.ReadAll(io.LimitReader(r, maxEvent+1))
	// The message ends with a sync flush, not a final block: the reader
	// runs out of input there.
	if errors.Is(err, io.ErrUnexpectedEOF) {
		err = nil
	}
	if err == nil && len(msg) > maxEvent {
		err = errTooLong
	}
	return msg, err
}

// appendClientFrame appends one unfragmented frame as a client sends it:
// masked, with a random key.
func appendClientFrame(dst []byte, op byte, payload []byte) []byte {
	dst = append(dst, 0x80|op)
	switch n := len(payload); {
	case n < 126:
		dst = append(dst, 0x80|byte(n))
	case n <= 0xffff:
		dst = append(dst, 0x80|126)
		dst = binary.BigEndian.AppendUint16(dst, uint16(n))
	default:
		dst = append(dst, 0x80|127)
		dst = binary.BigEndian.AppendUint64(dst, uint64(n))
	}
	var key [4]byte
	binary.LittleEndian.PutUint32(key[:], rand.Uint32())
	dst = append(dst, key[:]...)
	for i, c := range payload {
		dst = append(dst, c^key[i&3])
	}
	return dst
}
