//go:build unix

package wire

import (
	"bufio"
	"bytes"
	"compress/flate"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/pushd/pushd/internal/testenv"
)

// The tests of this file pin what Accept relies on in coder/websocket: a
// release of the library that changes any of it fails one of them.

func TestMain(m *testing.M) { testenv.Main(m) }

// TestLibraryReadsOnlyThroughTheGate: the library reads the client's bytes
// only through the reader Hijack gave it, the bytes sent with the
// handshake included, so the pings between and after a message's frames
// reach Control and never the library, which writes no pong; and its
// reader stops at the end of the message, so what follows waits for Pump.
func TestLibraryReadsOnlyThroughTheGate(t *testing.T) {
	var mu sync.Mutex
	var pings []string
	rec := &recorder{}
	srv := serve(t, Options{Writer: rec.wrap, Control: func(op byte, p []byte) bool {
		mu.Lock()
		defer mu.Unlock()
		pings = append(pings, fmt.Sprintf("%x %s", op, p))
		return true
	}})
	cl := dial(t, srv.addr, frame(false, opText, []byte("hel")))
	c := srv.conn(t)
	cl.send(frame(true, OpPing, []byte("between")), frame(true, 0x0, []byte("lo")), frame(true, OpPing, []byte("after")))

	typ, msg, err := c.Read(context.Background())
	if err != nil || typ != websocket.MessageText || string(msg) != "hello" {
		t.Fatalf("Read: %v %q, %v; want the text hello", typ, msg, err)
	}
	seen := func() string {
		mu.Lock()
		defer mu.Unlock()
		return strings.Join(pings, ", ")
	}
	if got := seen(); got != "9 between" {
		t.Fatalf("Control saw [%s] when the message was read; want the ping between its frames only", got)
	}
	if !c.Idle() {
		t.Fatal("the library's reader holds bytes past the message")
	}
	testenv.Eventually(t, "Pump takes the ping after the message", func() bool {
		if c.Pump(readNow(t, c)) {
			t.Fatal("Pump found a frame for the library")
		}
		return seen() == "9 between, 9 after"
	})
	if n := len(rec.all()); n > 0 {
		t.Fatalf("the library wrote %d times: it answered a ping itself", n)
	}
}

// TestLibraryWritesWholeFramesOnly: the library writes only close frames,
// each in one write, whether it closes on its own (a message over the read
// limit, an unknown opcode, the client's close) or is asked to with the
// longest reason a close frame holds; and a data frame after the close
// frame is refused.
func TestLibraryWritesWholeFramesOnly(t *testing.T) {
	longest := strings.Repeat("r", MaxControlFrame-2-2) // less the header and the status code
	for _, tc := range []struct {
		name   string
		send   []byte               // what the client sends once connected
		read   func(error) bool     // the error Read must end with; nil: Close is called instead
		code   websocket.StatusCode // of the close frame the client reads
		answer bool                 // the client answers the server's close frame
	}{
		{"read limit", frame(true, opText, bytes.Repeat([]byte("x"), 200)),
			func(err error) bool { return errors.Is(err, websocket.ErrMessageTooBig) }, websocket.StatusMessageTooBig, true},
		{"unknown opcode", frame(true, 0x3, []byte("x")),
			func(err error) bool { return err != nil && websocket.CloseStatus(err) == -1 }, websocket.StatusProtocolError, true},
		{"the client's close", frame(true, opClose, []byte{0x03, 0xe8}),
			func(err error) bool { return websocket.CloseStatus(err) == websocket.StatusNormalClosure }, websocket.StatusNormalClosure, false},
		{"asked to close", nil, nil, websocket.StatusGoingAway, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := &recorder{}
			srv := serve(t, Options{ReadLimit: 100, Writer: rec.wrap})
			cl := dial(t, srv.addr)
			c := srv.conn(t)
			closed := make(chan error, 1)
			if tc.read != nil {
				cl.send(tc.send)
				go func() {
					_, _, err := c.Read(context.Background())
					if !tc.read(err) {
						err = fmt.Errorf("Read ended with an unexpected error: %w", err)
					} else {
						err = nil
					}
					closed <- err
				}()
			} else {
				go func() { closed <- c.Close(tc.code, longest) }()
			}
			op, p, err := cl.next()
			if err != nil || op != opClose || len(p) < 2 || websocket.StatusCode(binary.BigEndian.Uint16(p)) != tc.code {
				t.Fatalf("the client read %x %q, %v; want a close frame with %d", op, p, err, tc.code)
			}
			if tc.read == nil && string(p[2:]) != longest {
				t.Fatalf("the close frame's reason is %q", p[2:])
			}
			if err := c.WriteFrames(AppendText(nil, []byte("late"))); !errors.Is(err, net.ErrClosed) {
				t.Fatalf("a data frame after the close frame: %v; want net.ErrClosed", err)
			}
			if tc.answer {
				cl.send(frame(true, opClose, p[:2]))
			}
			if err := <-closed; err != nil {
				t.Fatal(err)
			}
			c.CloseNow()
			writes := rec.all()
			if len(writes) != 1 {
				t.Fatalf("the library made %d writes; want its close frame alone", len(writes))
			}
			if op, payload, rest, ok := parseFrame(writes[0]); !ok || op != opClose || !bytes.Equal(payload, p) || len(rest) > 0 {
				t.Fatalf("the library's write % x is not one whole close frame", writes[0])
			}
		})
	}
}

// TestLibraryNegotiatesDeflateAlone: with Compression, a browser's offer
// of permessage-deflate is answered with no context takeover on either
// side (so a message compressed alone, once, serves every connection),
// the client reads AppendDeflated's frame as the message, and the
// library inflates the client's compressed messages itself. Without the
// offer, or without Compression, nothing is negotiated.
func TestLibraryNegotiatesDeflateAlone(t *testing.T) {
	const offer = "permessage-deflate; client_max_window_bits"
	for _, tc := range []struct {
		compression bool
		offer       string
		want        string
	}{
		{true, offer, "permessage-deflate; client_no_context_takeover; server_no_context_takeover"},
		{true, "", ""},
		{false, offer, ""},
	} {
		srv := serve(t, Options{Compression: tc.compression})
		cl := dialOffering(t, srv.addr, tc.offer)
		c := srv.conn(t)
		if cl.extensions != tc.want || c.Compressed() != (tc.want != "") {
			t.Fatalf("Compression %v, offer %q: the response's extensions are %q and Compressed %v; want %q",
				tc.compression, tc.offer, cl.extensions, c.Compressed(), tc.want)
		}
		if !c.Compressed() {
			continue
		}
		msg := []byte(strings.Repeat(`{"type":"task","progress":45}`, 4))
		deflated := Deflate(msg)
		if deflated == nil || len(deflated) >= len(msg) {
			t.Fatalf("Deflate(%d bytes) = %d bytes", len(msg), len(deflated))
		}
		if err := c.WriteFrames(AppendDeflated(nil, deflated)); err != nil {
			t.Fatal(err)
		}
		first, p, err := cl.nextFrame()
		if err != nil || first != 0xc1 {
			t.Fatalf("the client read a frame starting %x, %v; want a compressed text frame (c1)", first, err)
		}
		if got, err := io.ReadAll(flate.NewReader(io.MultiReader(bytes.NewReader(p), strings.NewReader(deflateTail)))); !bytes.Equal(got, msg) {
			t.Fatalf("the client inflated %q, %v; want %q", got, err, msg)
		}
		sent := frame(true, opText, deflated)
		sent[0] |= rsv1Bit
		cl.send(sent)
		if _, got, err := c.Read(context.Background()); err != nil || !bytes.Equal(got, msg) {
			t.Fatalf("the server read %q, %v; want the client's compressed message inflated", got, err)
		}
	}
	if Deflate([]byte("{}")) != nil {
		t.Error("Deflate of a message it cannot shrink did not return nil")
	}
}

func TestAppendTextFrameLengths(t *testing.T) {
	for _, tc := range []struct {
		n      int
		header []byte
	}{
		{0, []byte{0x81, 0}},
		{125, []byte{0x81, 125}},
		{126, []byte{0x81, 126, 0, 126}},
		{65535, []byte{0x81, 126, 0xff, 0xff}},
		{65536, []byte{0x81, 127, 0, 0, 0, 0, 0, 1, 0, 0}},
	} {
		p := bytes.Repeat([]byte{'x'}, tc.n)
		got := AppendText([]byte("prefix"), p)
		want := append(append([]byte("prefix"), tc.header...), p...)
		if !bytes.Equal(got, want) {
			t.Errorf("payload of %d bytes: header % x; want % x", tc.n, got[6:6+len(tc.header)], tc.header)
		}
	}
}

// server accepts WebSockets with Options and hands over each Conn.
type server struct {
	addr     string
	accepted chan *Conn
}

func serve(t *testing.T, o Options) *server {
	o.Subprotocol = "test"
	if o.Control == nil {
		o.Control = func(byte, []byte) bool { return true }
	}
	s := &server{accepted: make(chan *Conn, 1)}
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c := &Conn{}
		if err := c.Accept(w, r, o); err != nil {
			t.Errorf("Accept: %v", err)
			return
		}
		t.Cleanup(func() { c.CloseNow() })
		s.accepted <- c
	}))
	t.Cleanup(hs.Close)
	s.addr = hs.Listener.Addr().String()
	return s
}

func (s *server) conn(t *testing.T) *Conn {
	select {
	case c := <-s.accepted:
		return c
	case <-time.After(testenv.Wait):
		t.Fatal("no connection accepted")
		return nil
	}
}

// client is the client end, speaking frames by hand.
type client struct {
	t          *testing.T
	c          net.Conn
	br         *bufio.Reader
	extensions string // the response's Sec-WebSocket-Extensions
}

// dial opens a WebSocket, sending first in the handshake's write.
func dial(t *testing.T, addr string, first ...[]byte) *client {
	return dialOffering(t, addr, "", first...)
}

// dialOffering is dial with the extensions offered (a
// Sec-WebSocket-Extensions value, or none when empty); the response's
// are the client's extensions.
func dialOffering(t *testing.T, addr, offer string, first ...[]byte) *client {
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(testenv.Wait))
	req := "GET / HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n" +
		"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Protocol: test\r\n"
	if offer != "" {
		req += "Sec-WebSocket-Extensions: " + offer + "\r\n"
	}
	req += "\r\n"
	cl := &client{t: t, c: c, br: bufio.NewReader(c)}
	cl.send(append([][]byte{[]byte(req)}, first...)...)
	for {
		line, err := cl.br.ReadString('\n')
		if err != nil {
			t.Fatalf("handshake: %v", err)
		}
		if line == "\r\n" {
			return cl
		}
		if v, ok := strings.CutPrefix(line, "Sec-Websocket-Extensions: "); ok {
			cl.extensions = strings.TrimSpace(v)
		}
	}
}

func (cl *client) send(frames ...[]byte) {
	cl.t.Helper()
	if _, err := cl.c.Write(bytes.Join(frames, nil)); err != nil {
		cl.t.Fatal(err)
	}
}

// next reads the server's next frame.
func (cl *client) next() (op byte, payload []byte, err error) {
	first, payload, err := cl.nextFrame()
	return first & 0x0f, payload, err
}

// nextFrame reads the server's next frame, returning its first byte.
func (cl *client) nextFrame() (first byte, payload []byte, err error) {
	var b []byte
	for {
		if _, payload, _, ok := parseFrame(b); ok {
			return b[0], payload, nil
		}
		c, err := cl.br.ReadByte()
		if err != nil {
			return 0, nil, err
		}
		b = append(b, c)
	}
}

// parseFrame parses a server's (unmasked) frame at the head of b.
func parseFrame(b []byte) (op byte, payload, rest []byte, ok bool) {
	if len(b) < 2 {
		return 0, nil, nil, false
	}
	head, n := 2, uint64(b[1]&0x7f)
	switch {
	case n == 126 && len(b) >= 4:
		head, n = 4, uint64(binary.BigEndian.Uint16(b[2:]))
	case n == 127 && len(b) >= 10:
		head, n = 10, binary.BigEndian.Uint64(b[2:])
	case n >= 126:
		return 0, nil, nil, false
	}
	if uint64(len(b)-head) < n {
		return 0, nil, nil, false
	}
	end := head + int(n)
	return b[0] & 0x0f, b[head:end], b[end:], true
}

// recorder keeps every write to the connection's writer.
type recorder struct {
	mu     sync.Mutex
	writes [][]byte
}

func (r *recorder) wrap(conn net.Conn) io.Writer { return recording{r, conn} }

func (r *recorder) all() [][]byte {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.writes
}

type recording struct {
	r *recorder
	w io.Writer
}

func (w recording) Write(p []byte) (int, error) {
	w.r.mu.Lock()
	w.r.writes = append(w.r.writes, bytes.Clone(p))
	w.r.mu.Unlock()
	return w.w.Write(p)
}

// readNow reads what c's socket holds without waiting, as a poller's
// reader does.
func readNow(t *testing.T, c *Conn) func([]byte) (int, error) {
	raw := c.Raw()
	return func(b []byte) (n int, err error) {
		rerr := raw.Read(func(fd uintptr) bool {
			n, err = syscall.Read(int(fd), b)
			return true
		})
		switch {
		case rerr != nil:
			return 0, rerr
		case errors.Is(err, syscall.EAGAIN):
			return 0, ErrWouldBlock
		case err != nil:
			return 0, err
		case n == 0:
			return 0, io.EOF
		}
		return n, nil
	}
}
