package main

import (
	"bytes"
	"compress/flate"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"testing"

	"github.com/coder/websocket"
)

// pieceSizes are the sizes the stream tests cut a stream into: byte by
// byte, odd sizes that split events, fields and headers anywhere, and
// whole.
var pieceSizes = []int{1, 2, 3, 5, 7, 13, 64, 1 << 30}

// feedPieces feeds b to f in pieces of size n, and returns the first
// error. Each piece is read into one buffer, overwritten once fed, as the
// poller's is: a parser that keeps a piece past feed reads garbage.
func feedPieces(f feeder, b []byte, n int) error {
	buf := make([]byte, min(n, len(b)))
	for len(b) > 0 {
		k := copy(buf, b)
		err := f.feed(buf[:k], 1)
		for i := range buf {
			buf[i] = '#'
		}
		if err != nil {
			return err
		}
		b = b[k:]
	}
	return nil
}

// TestSSEParserPieces parses the stream TestReadSSE reads, cut into
// pieces of every size: the same events come out, however the reads split
// them.
func TestSSEParserPieces(t *testing.T) {
	long := strings.Repeat("x", 9000)
	stream := "retry: 2000\n" +
		"event: hello\ndata: {\"conn_id\":\"c1\"}\n\n" +
		": hb\n\n" +
		"event: task\r\nid: lt_3=4\r\ndata: {\"task_id\":\"lt_3\",\"version\":4,\r\ndata: \"sent_ns\":1,\"pad\":\"" + long + "\"}\r\n\r\n" +
		"event: mode\ndata: {\"mode\":\"polling\",\"reason\":\"pubsub_down\"}\n\n" +
		"event: task\nid: lt_3=3\ndata: {\"task_id\":\"lt_3\",\"version\":3,\"sent_ns\":1}\n\n" +
		"event: error\ndata: {\"code\":\"not_found\",\"task_id\":\"lt_9\"}\n\n" +
		"event: task\nid: lt_3=5\ndata: {\"task_id\":\"lt_3\",\"version\":5,\"sent_ns\":1}\n\n" +
		"event: task\nid: lt_3=6\ndata: {\"task_id\":\"lt_3\",\"version\":6,\"sent_ns\":1}" // not dispatched: no blank line yet
	for _, n := range pieceSizes {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			w := testWorker(false)
			c := &conn{w: w, task: 3}
			p := &sseParser{c: c}
			if err := feedPieces(p, []byte(stream), n); err != nil {
				t.Fatal(err)
			}
			if got := c.last.Load(); got != 5 {
				t.Errorf("last version %d, want 5", got)
			}
			if string(c.cursor) != "lt_3=6" {
				t.Errorf("cursor %q, want lt_3=6", c.cursor)
			}
			if n := w.regressions.Load(); n != 1 {
				t.Errorf("%d regressions, want 1 (version 3 after 4)", n)
			}
			if d := w.deliveriesForTest(); d != 3 {
				t.Errorf("%d deliveries, want 3", d)
			}
			if w.errs["error_event_not_found"] != 1 || len(w.errs) != 1 || w.modeSeen["polling"] == nil {
				t.Errorf("errors %v, modes %v", w.errs, w.modeSeen)
			}
			// The last event ends, a heartbeat follows: no buffer is left.
			if err := feedPieces(p, []byte("\n\n: hb\n"), n); err != nil {
				t.Fatal(err)
			}
			if got := c.last.Load(); got != 6 {
				t.Errorf("last version %d after the last event, want 6", got)
			}
			if p.line != nil || p.data != nil {
				t.Errorf("holds a line %q and data %q between events, want neither", p.line, p.data)
			}
		})
	}
}

// collect is a feeder that keeps what it is fed.
type collect struct{ b []byte }

func (c *collect) feed(b []byte, now int64) error { c.b = append(c.b, b...); return nil }

// chunk encodes parts in chunked transfer coding, as net/http writes a
// flushed body, with an extension and upper-case hex for good measure.
func chunk(parts ...string) string {
	var b strings.Builder
	for i, p := range parts {
		if i%2 == 0 {
			fmt.Fprintf(&b, "%x\r\n%s\r\n", len(p), p)
		} else {
			fmt.Fprintf(&b, "%X;ext=1\r\n%s\r\n", len(p), p)
		}
	}
	return b.String()
}

func TestDechunker(t *testing.T) {
	parts := []string{"\r\n", "data: {\"a\":1}\n\n", strings.Repeat("y", 4000), "data: {}\n\n"}
	want := strings.Join(parts, "")
	stream := chunk(parts...) + "0\r\n\r\n" + "after the last chunk"
	for _, n := range pieceSizes {
		got := &collect{}
		err := feedPieces(&dechunker{next: got}, []byte(stream), n)
		if !errors.Is(err, io.EOF) {
			t.Errorf("pieces of %d: %v, want EOF at the last chunk", n, err)
		}
		if string(got.b) != want {
			t.Errorf("pieces of %d: body %q..., want %q...", n, got.b[:min(len(got.b), 40)], want[:40])
		}
	}
	for _, bad := range []string{"zz\r\n", "\r\n", "3\r\nabcX"} {
		if err := (&dechunker{next: &collect{}}).feed([]byte(bad), 1); err == nil || errors.Is(err, io.EOF) {
			t.Errorf("%q: %v, want an error", bad, err)
		}
	}
}

// serverFrame encodes a frame as a server sends it: unmasked.
func serverFrame(fin bool, op byte, payload []byte) []byte {
	b0 := op
	if fin {
		b0 |= 0x80
	}
	f := []byte{b0}
	switch n := len(payload); {
	case n < 126:
		f = append(f, byte(n))
	case n <= 0xffff:
		f = append(f, 126)
		f = binary.BigEndian.AppendUint16(f, uint16(n))
	default:
		f = append(f, 127)
		f = binary.BigEndian.AppendUint64(f, uint64(n))
	}
	return append(f, payload...)
}

// unmask decodes one frame a client sent.
func unmask(t *testing.T, f []byte) (op byte, payload []byte) {
	t.Helper()
	if f[0]&0x80 == 0 || f[1]&0x80 == 0 {
		t.Fatalf("frame % x: not final or not masked", f[:2])
	}
	n, h := int(f[1]&0x7f), 2
	switch n {
	case 126:
		n, h = int(binary.BigEndian.Uint16(f[2:])), 4
	case 127:
		n, h = int(binary.BigEndian.Uint64(f[2:])), 10
	}
	key, p := f[h:h+4], f[h+4:]
	if len(p) != n {
		t.Fatalf("frame of %d payload bytes says %d", len(p), n)
	}
	out := make([]byte, n)
	for i := range p {
		out[i] = p[i] ^ key[i&3]
	}
	return f[0] & 0x0f, out
}

// TestWSParserPieces reads a session's frames cut into pieces of every
// size: short, 16-bit and 64-bit lengths, a message in three fragments
// with a ping between them, which is answered with a masked pong of the
// same payload, an empty message, and a close frame, which ends the stream
// with its code and reason.
func TestWSParserPieces(t *testing.T) {
	mid, big := bytes.Repeat([]byte("m"), 300), bytes.Repeat([]byte("b"), 70000)
	var stream []byte
	stream = append(stream, serverFrame(true, opText, []byte(`{"type":"ack","id":1}`))...)
	stream = append(stream, serverFrame(true, opText, mid)...)
	stream = append(stream, serverFrame(true, opBinary, big)...)
	stream = append(stream, serverFrame(false, opText, []byte("frag-1,"))...)
	stream = append(stream, serverFrame(true, opPing, []byte("are you there"))...)
	stream = append(stream, serverFrame(false, opContinuation, []byte("frag-2,"))...)
	stream = append(stream, serverFrame(true, opPong, nil)...)
	stream = append(stream, serverFrame(true, opContinuation, []byte("frag-3"))...)
	stream = append(stream, serverFrame(true, opText, nil)...)
	idle := len(stream) // every message read, nothing cut
	stream = append(stream, serverFrame(true, opClose, append([]byte{0x03, 0xe9}, "going away"...))...)
	stream = append(stream, serverFrame(true, opText, []byte("after the close"))...)
	want := []string{`{"type":"ack","id":1}`, string(mid), string(big), "frag-1,frag-2,frag-3", ""}

	for _, n := range pieceSizes {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			var got []string
			var sent [][]byte
			p := &wsParser{
				onMessage: func(msg []byte, now int64) error { got = append(got, string(msg)); return nil },
				send:      func(f []byte) error { sent = append(sent, bytes.Clone(f)); return nil },
			}
			err := feedPieces(p, stream[:idle], n)
			if err != nil || p.msg != nil || p.ctl != nil {
				t.Errorf("%v, holding %d message and %d control bytes between messages, want none", err, len(p.msg), len(p.ctl))
			}
			err = feedPieces(p, stream[idle:], n)
			var ce websocket.CloseError
			if !errors.As(err, &ce) || ce.Code != 1001 || ce.Reason != "going away" {
				t.Errorf("stream ended with %v, want close 1001 going away", err)
			}
			if websocket.CloseStatus(err) != websocket.StatusGoingAway {
				t.Errorf("CloseStatus %d", websocket.CloseStatus(err))
			}
			if len(got) != len(want) {
				t.Fatalf("%d messages, want %d", len(got), len(want))
			}
			for i := range want {
				if got[i] != want[i] {
					t.Errorf("message %d: %.40q, want %.40q", i, got[i], want[i])
				}
			}
			if len(sent) != 1 {
				t.Fatalf("%d frames sent, want the pong", len(sent))
			}
			if op, payload := unmask(t, sent[0]); op != opPong || string(payload) != "are you there" {
				t.Errorf("sent opcode %d %q, want a pong of the ping's payload", op, payload)
			}
		})
	}
}

// TestWSParserInflates: where compression was negotiated, a compressed
// message (RSV1 on its first frame, fragmented or not) is read inflated,
// an uncompressed one as it is, in pieces of every size.
func TestWSParserInflates(t *testing.T) {
	msg := []byte(strings.Repeat(`{"type":"task","progress":45}`, 8))
	var b bytes.Buffer
	w, _ := flate.NewWriter(&b, flate.BestSpeed)
	w.Write(msg)
	w.Flush()
	deflated := bytes.TrimSuffix(b.Bytes(), []byte(deflateTail))
	whole := serverFrame(true, opText, deflated)
	whole[0] |= 0x40
	first := serverFrame(false, opText, deflated[:10])
	first[0] |= 0x40
	stream := slices.Concat(whole, serverFrame(true, opText, []byte("plain")), first, serverFrame(true, opContinuation, deflated[10:]))
	for _, n := range pieceSizes {
		var got []string
		p := &wsParser{deflate: true,
			onMessage: func(m []byte, now int64) error { got = append(got, string(m)); return nil },
			send:      func([]byte) error { return nil }}
		if err := feedPieces(p, stream, n); err != nil {
			t.Fatalf("pieces of %d: %v", n, err)
		}
		if want := []string{string(msg), "plain", string(msg)}; !slices.Equal(got, want) {
			t.Fatalf("pieces of %d: read %.60q, want %.60q", n, got, want)
		}
	}
	p := &wsParser{onMessage: func([]byte, int64) error { return nil }, send: func([]byte) error { return nil }}
	if err := p.feed(whole, 1); err == nil {
		t.Error("a compressed message was read where compression was not negotiated")
	}
}

func TestWSParserRefuses(t *testing.T) {
	for name, frame := range map[string][]byte{
		"masked":                  {0x81, 0x81, 1, 2, 3, 4, 'x'},
		"continuation alone":      serverFrame(true, opContinuation, []byte("x")),
		"reserved bits":           {0xc1, 0x00},
		"fragmented ping":         serverFrame(false, opPing, nil),
		"long ping":               serverFrame(true, opPing, make([]byte, 126)),
		"unknown opcode":          serverFrame(true, 0x3, nil),
		"message over the limit":  serverFrame(true, opText, make([]byte, maxEvent+1)),
		"message inside fragment": append(serverFrame(false, opText, []byte("a")), serverFrame(true, opText, []byte("b"))...),
	} {
		p := &wsParser{onMessage: func([]byte, int64) error { return nil }, send: func([]byte) error { return nil }}
		if err := p.feed(frame, 1); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

// TestClientFrame checks the frames the client writes, at each length
// encoding.
func TestClientFrame(t *testing.T) {
	for _, n := range []int{0, 2, 125, 126, 300, 70000} {
		payload := bytes.Repeat([]byte{'p'}, n)
		op, got := unmask(t, appendClientFrame(nil, opText, payload))
		if op != opText || !bytes.Equal(got, payload) {
			t.Errorf("%d bytes: opcode %d, payload of %d bytes", n, op, len(got))
		}
	}
}
