package ws

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/pushd/pushd/fanout"
	"github.com/pushd/pushd/hub"
	"github.com/pushd/pushd/internal/testenv"
	"github.com/pushd/pushd/snapshot"
	"github.com/pushd/pushd/ws/internal/wire"
)

// serveHub is serve with the hub's settings, returning the hub too and the
// server's address.
func serveHub(t testing.TB, hc hub.Config, cfg Config) (*hub.Hub, string) {
	t.Helper()
	bus := fanout.NewMemoryBus()
	hc.Source, hc.Bus = snapshot.NewMemoryStore(), bus
	h := hub.New(hc)
	bus.Start(h)
	cfg.Hub = h
	wh := New(cfg)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		wh.Serve(w, r, hub.Principal{TenantID: "t1", UserID: "u1", Grant: &snapshot.Grant{All: true}})
	}))
	t.Cleanup(func() {
		srv.Close()
		h.Close()
		wh.Close()
		bus.Close()
	})
	return h, strings.TrimPrefix(srv.URL, "http://")
}

// rawClient is a WebSocket client written by hand, so a test decides every
// frame, and answers nothing by itself.
type rawClient struct {
	t  testing.TB
	c  net.Conn
	br *bufio.Reader
}

// rawDial opens a WebSocket, sending first after the handshake's request,
// in the same write.
func rawDial(t *testing.T, addr string, first ...[]byte) *rawClient {
	t.Helper()
	r, err := rawDialErr(t, addr, first...)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// rawDialErr is rawDial for other goroutines than the test's.
func rawDialErr(t testing.TB, addr string, first ...[]byte) (*rawClient, error) {
	c, err := net.Dial("tcp", addr)
	if err != nil {
		return nil, err
	}
	t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(testenv.Wait))
	req := fmt.Appendf(nil, "GET /v1/ws HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"+
		"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Protocol: %s\r\n\r\n", Subprotocol)
	if _, err := c.Write(bytes.Join(append([][]byte{req}, first...), nil)); err != nil {
		return nil, err
	}
	r := &rawClient{t: t, c: c, br: bufio.NewReader(c)}
	for {
		line, err := r.br.ReadString('\n')
		if err != nil {
			return nil, fmt.Errorf("handshake: %w", err)
		}
		if line == "\r\n" {
			return r, nil
		}
	}
}

// frame is a client's frame: masked, as a client's must be.
var frame = testenv.WSClientFrame

func (r *rawClient) send(frames ...[]byte) {
	r.t.Helper()
	if _, err := r.c.Write(bytes.Join(frames, nil)); err != nil {
		r.t.Fatal(err)
	}
}

// next reads the server's next frame.
func (r *rawClient) next() (op byte, payload []byte, err error) {
	var head [2]byte
	if _, err := io.ReadFull(r.br, head[:]); err != nil {
		return 0, nil, err
	}
	n := int(head[1] & 0x7f)
	switch n {
	case 126:
		var b [2]byte
		if _, err := io.ReadFull(r.br, b[:]); err != nil {
			return 0, nil, err
		}
		n = int(binary.BigEndian.Uint16(b[:]))
	case 127:
		var b [8]byte
		if _, err := io.ReadFull(r.br, b[:]); err != nil {
			return 0, nil, err
		}
		n = int(binary.BigEndian.Uint64(b[:]))
	}
	payload = make([]byte, n)
	_, err = io.ReadFull(r.br, payload)
	return head[0] & 0x0f, payload, err
}

// until reads frames until one has op and contains want; pings met on the
// way are counted, and answered when answer is set.
func (r *rawClient) until(op byte, want string, answer bool) (pings int) {
	r.t.Helper()
	for {
		got, p, err := r.next()
		if err != nil {
			r.t.Fatalf("waiting for %q: %v", want, err)
		}
		if got == opPing {
			pings++
			if answer {
				r.send(frame(true, opPong, p))
			}
		}
		if got == op && bytes.Contains(p, []byte(want)) {
			return pings
		}
	}
}

// Opcodes of the frames the tests send and read.
const (
	opText  = 0x1
	opClose = 0x8
	opPing  = wire.OpPing
	opPong  = wire.OpPong
)

// Idle WebSockets park: they hold no goroutine, even with half a frame
// read, yet answer a ping and take a request at once, and a client that
// goes away is cleaned up.
func TestIdleConnectionsParkWithNoGoroutine(t *testing.T) {
	const conns = 200
	h, addr := serveHub(t, hub.Config{}, Config{})
	base := runtime.NumGoroutine()
	clients := make([]*rawClient, conns)
	for i := range clients {
		clients[i] = rawDial(t, addr)
		clients[i].send(frame(true, opText, []byte(`{"op":"subscribe","id":1}`)))
		clients[i].until(opText, `"type":"ack"`, false)
	}
	// A handful more than before: the poller's loop, and readers finishing.
	parked := func() bool { return runtime.NumGoroutine() <= base+5 }
	testenv.Eventually(t, "idle connections parked", parked)
	for i, c := range clients {
		c.send(frame(true, opPing, fmt.Appendf(nil, "ping %d", i)))
		if _, p, err := c.next(); err != nil || string(p) != fmt.Sprintf("ping %d", i) {
			t.Fatalf("client %d: pong %q, %v", i, p, err)
		}
	}
	testenv.Eventually(t, "connections parked again after the pings", parked)
	// Half a frame's head, then nothing: still no goroutine.
	req := frame(true, opText, []byte(`{"op":"subscribe","id":2,"tasks":["a"]}`))
	for _, c := range clients {
		c.send(req[:3])
	}
	testenv.Eventually(t, "connections parked with half a frame read", parked)
	for i, c := range clients {
		c.send(req[3:])
		c.until(opText, `"id":2`, false)
		if i%2 == 0 {
			c.send(frame(true, opClose, []byte{0x03, 0xe8})) // 1000
		} else {
			c.c.Close()
		}
	}
	testenv.Eventually(t, "closed clients' connections ended", func() bool { return h.Len() == 0 })
	testenv.Eventually(t, "no goroutine left per connection", func() bool { return runtime.NumGoroutine() <= base+5 })
}

// A request sent with the handshake's bytes, and a message in two frames
// with a ping between them, are read whole.
func TestRequestsInAnyShape(t *testing.T) {
	_, addr := serveHub(t, hub.Config{}, Config{})
	c := rawDial(t, addr, frame(true, opText, []byte(`{"op":"subscribe","id":1}`)))
	c.until(opText, `"id":1`, false)

	c.send(frame(false, opText, []byte(`{"op":"subscribe",`)), frame(true, opPing, []byte("between")),
		frame(true, 0x0, []byte(`"id":2}`)))
	if op, p, err := c.next(); err != nil || op != opPong || string(p) != "between" {
		t.Fatalf("pong between fragments: op %d %q, %v", op, p, err)
	}
	c.until(opText, `"id":2`, false)

	long := fmt.Sprintf(`{"op":"subscribe","id":3,"tasks":[%s"a"]}`, strings.Repeat(`"padding_task",`, 40))
	c.send(frame(true, opText, []byte(long)))
	c.until(opText, `"id":3`, false)
}

// The node pings an idle client every heartbeat: one that answers stays,
// one that does not is closed once the write timeout passed.
func TestUnansweredPingEndsTheConnection(t *testing.T) {
	h, addr := serveHub(t, hub.Config{HeartbeatInterval: 50 * time.Millisecond, WriteTimeout: 200 * time.Millisecond}, Config{})
	answers := rawDial(t, addr)
	silent := rawDial(t, addr)
	for _, c := range []*rawClient{answers, silent} {
		c.send(frame(true, opText, []byte(`{"op":"subscribe","id":1}`)))
		c.until(opText, `"type":"ack"`, false)
	}
	// The silent client reads without answering until the node closes it.
	closed := make(chan int, 1)
	go func() {
		pings := 0
		for {
			op, _, err := silent.next()
			if err != nil {
				closed <- pings
				return
			}
			if op == opPing {
				pings++
			}
		}
	}()
	answered := 0
	for {
		select {
		case pings := <-closed:
			if pings == 0 {
				t.Fatal("the silent client was closed without a ping")
			}
			if answered < 2 {
				t.Fatalf("the answering client saw %d pings meanwhile, want at least 2", answered)
			}
			answers.send(frame(true, opText, []byte(`{"op":"subscribe","id":2}`)))
			answered += answers.until(opText, `"id":2`, true)
			testenv.Eventually(t, "one connection left", func() bool { return h.Len() == 1 })
			return
		default:
		}
		op, p, err := answers.next()
		if err != nil {
			t.Fatalf("the answering client: %v", err)
		}
		if op == opPing {
			answered++
			answers.send(frame(true, opPong, p))
		}
	}
}

// Connections that come and go (close handshakes, whose answer closes the
// socket before the connection ends) beside parked ones leave those awake:
// every parked connection takes its next request. The poller's own test
// pins down the socket number reused.
func TestChurnLeavesParkedConnectionsAwake(t *testing.T) {
	const workers, cycles = 16, 40
	_, addr := serveHub(t, hub.Config{}, Config{})
	errs := make(chan error, workers)
	for w := range workers {
		go func() {
			errs <- func() error {
				for i := range cycles {
					c, err := rawDialErr(t, addr, frame(true, opText, []byte(`{"op":"subscribe","id":1}`)))
					if err != nil {
						return err
					}
					if _, err := c.untilErr(opText, `"id":1`); err != nil {
						return err
					}
					if (w+i)%2 == 0 {
						// A close handshake: the library closes the socket as
						// it answers, before the connection ends.
						c.c.Write(frame(true, opClose, []byte{0x03, 0xe8}))
						c.untilErr(opClose, "")
						c.c.Close()
						continue
					}
					// Parked by now or soon; a request must wake it.
					if _, err := c.c.Write(frame(true, opText, []byte(`{"op":"subscribe","id":2}`))); err != nil {
						return err
					}
					if _, err := c.untilErr(opText, `"id":2`); err != nil {
						return fmt.Errorf("worker %d cycle %d: the request of a parked connection: %w", w, i, err)
					}
					c.c.Close()
				}
				return nil
			}()
		}()
	}
	for range workers {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
}

// untilErr is until for other goroutines than the test's: it returns the
// error instead of failing.
func (r *rawClient) untilErr(op byte, want string) ([]byte, error) {
	for {
		got, p, err := r.next()
		if err != nil {
			return nil, err
		}
		if got == op && bytes.Contains(p, []byte(want)) {
			return p, nil
		}
	}
}
