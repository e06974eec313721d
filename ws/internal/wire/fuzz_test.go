package wire

import (
	"bytes"
	"io"
	"net"
	"testing"
	"time"

	"github.com/pushd/pushd/internal/testenv"
)

// chunks is a client's byte stream arriving in pieces: Read hands out one
// piece (or what fits) per call, readNow the same or, between pieces when
// told, nothing yet.
type chunks struct {
	pieces [][]byte
	stall  []bool // before piece i, readNow first finds nothing
}

func (c *chunks) Read(p []byte) (int, error) {
	if len(c.pieces) == 0 {
		return 0, io.EOF
	}
	n := copy(p, c.pieces[0])
	if c.pieces[0] = c.pieces[0][n:]; len(c.pieces[0]) == 0 {
		c.pieces, c.stall = c.pieces[1:], c.stall[1:]
	}
	return n, nil
}

func (c *chunks) readNow(p []byte) (int, error) {
	if len(c.stall) > 0 && c.stall[0] {
		c.stall[0] = false
		return 0, ErrWouldBlock
	}
	return c.Read(p)
}

// FuzzGate sends a stream of client frames built from the input (text,
// continuations, pings, pongs, and pings without a mask, which a client
// must not send) through the gate in pieces, read in turn by pump and by
// the library's reads. The library must get exactly the frames that are
// not well-formed pings and pongs, byte for byte, and the gate each ping
// and pong's payload, unmasked, in order.
func FuzzGate(f *testing.F) {
	f.Add([]byte{0, 5, 2, 3, 1, 1, 9, 4, 7}, uint8(7))
	f.Add([]byte{2, 125, 3, 0, 0, 200, 4, 2}, uint8(1))
	f.Add([]byte{1, 130, 2, 10, 0, 255, 3, 126}, uint8(64))
	f.Fuzz(func(t *testing.T, spec []byte, readSize uint8) {
		var stream, want []byte
		var controls [][]byte
		for i := 0; i+1 < len(spec); i += 2 {
			kind, n := spec[i]%5, int(spec[i+1])
			p := bytes.Repeat([]byte{byte(i)}, n)
			switch kind {
			case 0, 1: // text, continuation: the library's
				fr := frame(kind == 0 && n%2 == 0, []byte{opText, 0x0}[kind], p)
				stream, want = append(stream, fr...), append(want, fr...)
			case 2, 3: // ping, pong: the gate's when they may be
				op := []byte{OpPing, OpPong}[kind-2]
				fr := frame(true, op, p)
				stream = append(stream, fr...)
				if n <= 125 {
					controls = append(controls, p)
				} else {
					want = append(want, fr...)
				}
			case 4: // an unmasked ping: the library refuses it
				fr := append([]byte{0x80 | OpPing, byte(min(n, 125))}, p[:min(n, 125)]...)
				stream, want = append(stream, fr...), append(want, fr...)
			}
		}
		src := &chunks{}
		for i := 0; i < len(stream); {
			n := 1 + (i*7+int(readSize))%23
			n = min(n, len(stream)-i)
			src.pieces = append(src.pieces, stream[i:i+n])
			src.stall = append(src.stall, (i+int(readSize))%3 == 0)
			i += n
		}
		var got [][]byte
		g := &gate{conn: gatedTestConn{src}, control: func(op byte, p []byte) bool {
			got = append(got, bytes.Clone(p))
			return true
		}}
		var out []byte
		buf := make([]byte, 1+int(readSize))
		for steps := 0; ; steps++ {
			if steps > 10*len(stream)+100 {
				t.Fatalf("no end after %d steps", steps)
			}
			if !g.pump(src.readNow) {
				continue // nothing for the library yet: parked, then woken
			}
			n, err := g.Read(buf)
			out = append(out, buf[:n]...)
			if err != nil {
				if err != io.EOF {
					t.Fatal(err)
				}
				break
			}
		}
		if !bytes.Equal(out, want) {
			t.Fatalf("the library got %d bytes, want %d:\n got %x\nwant %x", len(out), len(want), out, want)
		}
		if len(got) != len(controls) {
			t.Fatalf("%d control payloads, want %d", len(got), len(controls))
		}
		for i := range got {
			if !bytes.Equal(got[i], controls[i]) {
				t.Fatalf("control payload %d: %x, want %x", i, got[i], controls[i])
			}
		}
	})
}

// gatedTestConn is a net.Conn that only reads, for the gate's source.
type gatedTestConn struct{ r io.Reader }

func (c gatedTestConn) Read(p []byte) (int, error)     { return c.r.Read(p) }
func (gatedTestConn) Write(p []byte) (int, error)      { return len(p), nil }
func (gatedTestConn) Close() error                     { return nil }
func (gatedTestConn) LocalAddr() net.Addr              { return nil }
func (gatedTestConn) RemoteAddr() net.Addr             { return nil }
func (gatedTestConn) SetDeadline(time.Time) error      { return nil }
func (gatedTestConn) SetReadDeadline(time.Time) error  { return nil }
func (gatedTestConn) SetWriteDeadline(time.Time) error { return nil }

// frame is a client's frame: masked, as a client's must be.
var frame = testenv.WSClientFrame
