//go:build !race

// The race detector changes what allocates and how big objects are, so
// memory guards run without it: scripts/test runs them in a step of their
// own.

package ws_test

import (
	"bufio"
	"bytes"
	"compress/flate"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/pushd/pushd/fanout"
	"github.com/pushd/pushd/hub"
	"github.com/pushd/pushd/internal/testenv"
	"github.com/pushd/pushd/snapshot"
	"github.com/pushd/pushd/ws"
)

// maxIdleBytesPerConn bounds what an idle WebSocket keeps live: the hub's
// Conn with what it watches and delivered, the index entry of its task,
// the sink with its backlog writer and wire.Conn (the gate, the frame
// writer, coder/websocket's Conn and buffers), and both ends of the TCP connection (the client's is in this
// process too; it has no goroutine). A parked connection has no reader
// goroutine: it measured 4,700-4,790 bytes (4,790-4,830 once the index
// kept a note per task watched by id, the delivery inspector's), where a
// reader blocked in coder/websocket's read (a stack of 4 KiB) made it
// 8,720-9,200. The bound
// sits above that spread and far below what a reader would add.
const maxIdleBytesPerConn = 5600

// maxIdleBytesPerCompressingConn bounds the same for a client that
// negotiated compression and compressed its request, as browsers do: the
// library then keeps a 4 KiB reader for the connection's life.
const maxIdleBytesPerCompressingConn = maxIdleBytesPerConn + 4096 + 512

// TestIdleWebSocketMemory opens conns real WebSockets, each subscribed to
// a task of its own as the idle load test's are, waits until each has its
// snapshot, and bounds the live heap and stacks they added per connection:
// with clients that do not offer compression, and with clients that
// negotiate it and compress their request.
// With IDLEMEM_PROF set to a file name, it writes a heap profile there at
// the measurement (run it with -memprofilerate=1 for every allocation).
func TestIdleWebSocketMemory(t *testing.T) {
	t.Run("plain", func(t *testing.T) { idleWebSocketMemory(t, false, maxIdleBytesPerConn) })
	t.Run("compressing", func(t *testing.T) { idleWebSocketMemory(t, true, maxIdleBytesPerCompressingConn) })
}

func idleWebSocketMemory(t *testing.T, deflate bool, bound int64) {
	const conns = 2000
	store := snapshot.NewMemoryStore()
	bus := fanout.NewMemoryBus()
	h := hub.New(hub.Config{Source: store, Bus: bus})
	bus.Start(h)
	wh := ws.New(ws.Config{Hub: h, Compression: deflate})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		wh.Serve(w, r, hub.Principal{TenantID: "t1", UserID: "u1", Grant: &snapshot.Grant{All: true}})
	}))
	t.Cleanup(func() {
		h.Close()
		wh.Close()
		bus.Close()
		srv.Close()
	})
	for i := range conns + 1 {
		sn, err := snapshot.Parse(fmt.Appendf(nil, `{"task_id":"task_%d","tenant_id":"t1","user_id":"u1","status":"RUNNING","version":1}`, i))
		if err != nil {
			t.Fatal(err)
		}
		store.SetIfNewer(context.Background(), sn)
	}
	addr := strings.TrimPrefix(srv.URL, "http://")
	open := func(i int) net.Conn {
		t.Helper()
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		c.SetDeadline(time.Now().Add(10 * time.Second))
		offer := ""
		if deflate {
			offer = "Sec-WebSocket-Extensions: permessage-deflate; client_max_window_bits\r\n"
		}
		fmt.Fprintf(c, "GET /v1/ws HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"+
			"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Protocol: %s\r\n%s\r\n", ws.Subprotocol, offer)
		br := bufio.NewReaderSize(c, 512)
		for {
			line, err := br.ReadString('\n')
			if err != nil {
				t.Fatalf("websocket %d: handshake: %v", i, err)
			}
			if line == "\r\n" {
				break
			}
		}
		req := fmt.Appendf(nil, `{"op":"subscribe","id":1,"tasks":["task_%d"]}`, i)
		if deflate {
			writeMasked(t, c, 0xc1, deflated(t, req))
		} else {
			writeMasked(t, c, 0x81, req)
		}
		for {
			first, msg, err := readFrame(br)
			if err != nil {
				t.Fatalf("websocket %d: %v", i, err)
			}
			if first&0x40 != 0 {
				msg = inflated(t, msg)
			}
			if strings.HasPrefix(string(msg), `{"type":"task"`) {
				break
			}
		}
		c.SetDeadline(time.Time{})
		return c
	}
	per := testenv.LiveBytesPerConn(t, conns, open, func() bool { return h.Len() == conns+1 })
	t.Logf("%d bytes live per idle WebSocket", per)
	if per > bound {
		t.Fatalf("an idle WebSocket keeps %d bytes live, want at most %d", per, bound)
	}
}

// deflated is p compressed as a message of permessage-deflate.
func deflated(t *testing.T, p []byte) []byte {
	var b bytes.Buffer
	w, err := flate.NewWriter(&b, flate.BestSpeed)
	if err != nil {
		t.Fatal(err)
	}
	w.Write(p)
	w.Flush()
	return bytes.TrimSuffix(b.Bytes(), []byte("\x00\x00\xff\xff"))
}

// inflated is the message compressed in p.
func inflated(t *testing.T, p []byte) []byte {
	msg, err := io.ReadAll(flate.NewReader(io.MultiReader(bytes.NewReader(p), strings.NewReader("\x00\x00\xff\xff"))))
	if len(msg) == 0 {
		t.Fatalf("inflating a message: %v", err)
	}
	return msg
}

// writeMasked writes p as one masked frame whose first byte is first, as
// a client must; the mask is zero, so p goes out as it is.
func writeMasked(t *testing.T, c net.Conn, first byte, p []byte) {
	t.Helper()
	if len(p) > 125 {
		t.Fatalf("frame of %d bytes: too long for this test's client", len(p))
	}
	frame := append([]byte{first, 0x80 | byte(len(p)), 0, 0, 0, 0}, p...)
	if _, err := c.Write(frame); err != nil {
		t.Fatal(err)
	}
}

// readFrame reads one unmasked frame from the server and returns its
// first byte and its payload.
func readFrame(br *bufio.Reader) (byte, []byte, error) {
	var head [2]byte
	if _, err := io.ReadFull(br, head[:]); err != nil {
		return 0, nil, err
	}
	n := uint64(head[1] & 0x7f)
	switch n {
	case 126:
		var b [2]byte
		if _, err := io.ReadFull(br, b[:]); err != nil {
			return 0, nil, err
		}
		n = uint64(binary.BigEndian.Uint16(b[:]))
	case 127:
		var b [8]byte
		if _, err := io.ReadFull(br, b[:]); err != nil {
			return 0, nil, err
		}
		n = binary.BigEndian.Uint64(b[:])
	}
	p := make([]byte, n)
	_, err := io.ReadFull(br, p)
	return head[0], p, err
}
