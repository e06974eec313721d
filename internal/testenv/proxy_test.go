package testenv

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"
)

// silence is how long a test watches a stalled connection for bytes that
// must not arrive; prompt bounds how long an expected event may take.
const (
	silence = 200 * time.Millisecond
	prompt  = 5 * time.Second
)

// checkLeaks fails t if a goroutine started during t outlives its cleanups.
// Call it first, so that its cleanup runs last.
func checkLeaks(t *testing.T) {
	t.Helper()
	ignore := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, ignore) })
}

// echoServer is a TCP server that writes back whatever it reads. It counts
// the connections it accepts and the bytes it receives, and hands each
// connection to the test on accepted so that the test can push bytes to the
// client on its own.
type echoServer struct {
	addr     string
	accepts  atomic.Int64
	received atomic.Int64
	accepted chan net.Conn

	ln net.Listener
	wg sync.WaitGroup

	mu    sync.Mutex
	conns map[net.Conn]struct{}
}

func startEcho(t *testing.T) *echoServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("echo listen: %v", err)
	}
	s := &echoServer{
		addr:     ln.Addr().String(),
		accepted: make(chan net.Conn, 16),
		ln:       ln,
		conns:    make(map[net.Conn]struct{}),
	}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s.accepts.Add(1)
			s.mu.Lock()
			s.conns[c] = struct{}{}
			s.mu.Unlock()
			select {
			case s.accepted <- c:
			default:
			}
			s.wg.Add(1)
			go s.echo(c)
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		s.mu.Lock()
		for c := range s.conns {
			c.Close()
		}
		s.mu.Unlock()
		s.wg.Wait()
	})
	return s
}

func (s *echoServer) echo(c net.Conn) {
	defer s.wg.Done()
	defer func() {
		s.mu.Lock()
		delete(s.conns, c)
		s.mu.Unlock()
		c.Close()
	}()
	buf := make([]byte, 4096)
	for {
		n, err := c.Read(buf)
		s.received.Add(int64(n))
		if n > 0 {
			if _, err := c.Write(buf[:n]); err != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// next returns the server side of the next connection the server accepts.
func (s *echoServer) next(t *testing.T) net.Conn {
	t.Helper()
	select {
	case c := <-s.accepted:
		return c
	case <-time.After(prompt):
		t.Fatalf("echo server accepted no connection in %v", prompt)
		return nil
	}
}

func dial(t *testing.T, addr string) net.Conn {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, prompt)
	if err != nil {
		t.Fatalf("dial %s: %v", addr, err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func write(t *testing.T, c net.Conn, msg string) {
	t.Helper()
	c.SetWriteDeadline(time.Now().Add(prompt))
	if _, err := io.WriteString(c, msg); err != nil {
		t.Fatalf("write %q: %v", msg, err)
	}
}

// expect reads exactly len(want) bytes from c and compares them with want.
func expect(t *testing.T, c net.Conn, want string) {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(prompt))
	got := make([]byte, len(want))
	if _, err := io.ReadFull(c, got); err != nil {
		t.Fatalf("read %q: %v (got %q)", want, err, got)
	}
	if string(got) != want {
		t.Fatalf("read %q, want %q", got, want)
	}
}

func roundTrip(t *testing.T, c net.Conn, msg string) {
	t.Helper()
	write(t, c, msg)
	expect(t, c, msg)
}

// expectSilence asserts that nothing, not even EOF or RST, arrives on c
// while the test watches it.
func expectSilence(t *testing.T, c net.Conn) {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(silence))
	var b [64]byte
	n, err := c.Read(b[:])
	if n > 0 || !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("stalled connection read %q, %v; want nothing", b[:n], err)
	}
}

// expectClosed asserts that c promptly reads the end want: io.EOF or a reset.
func expectClosed(t *testing.T, c net.Conn, want error) {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(prompt))
	var b [64]byte
	n, err := c.Read(b[:])
	if n > 0 || !errors.Is(err, want) {
		t.Fatalf("read %q, %v; want %v", b[:n], err, want)
	}
}

func expectConns(t *testing.T, p *Proxy, want int) {
	t.Helper()
	if got := p.Conns(); got != want {
		t.Fatalf("Conns() = %d, want %d", got, want)
	}
}

func TestProxyPass(t *testing.T) {
	checkLeaks(t)
	srv := startEcho(t)
	p := StartProxy(t, srv.addr)

	c := dial(t, p.Addr)
	roundTrip(t, c, "hello")
	expectConns(t, p, 1)

	// Server to client on the server's own initiative.
	write(t, srv.next(t), "push")
	expect(t, c, "push")

	// More than a chunk each way, written while it is read back.
	big := bytes.Repeat([]byte("0123456789abcdef"), 64<<10)
	werr := make(chan error, 1)
	go func() {
		_, err := c.Write(big)
		werr <- err
	}()
	expect(t, c, string(big))
	if err := <-werr; err != nil {
		t.Fatalf("write %d bytes: %v", len(big), err)
	}

	// A half-close crosses the proxy: the echo server sees EOF and closes.
	if err := c.(*net.TCPConn).CloseWrite(); err != nil {
		t.Fatal(err)
	}
	expectClosed(t, c, io.EOF)
	p.waitConns(t, 0, prompt)
}

func TestProxyStall(t *testing.T) {
	checkLeaks(t)
	srv := startEcho(t)
	p := StartProxy(t, srv.addr)

	c1 := dial(t, p.Addr)
	roundTrip(t, c1, "hello")
	s1 := srv.next(t)
	received := srv.received.Load()

	p.Stall()
	write(t, s1, "push") // server to client
	write(t, c1, "ping") // client to server
	expectSilence(t, c1)
	if got := srv.received.Load(); got != received {
		t.Fatalf("server received %d bytes through a stalled link", got-received)
	}

	// A new connection is forwarded while the old one stalls.
	c2 := dial(t, p.Addr)
	roundTrip(t, c2, "redial")
	expectConns(t, p, 2)

	// Pass delivers what the stall held, in order, and the link works again.
	p.Pass()
	expect(t, c1, "pushping")
	roundTrip(t, c1, "again")
	roundTrip(t, c2, "still")
}

func TestProxyStallAll(t *testing.T) {
	checkLeaks(t)
	srv := startEcho(t)
	p := StartProxy(t, srv.addr)

	c1 := dial(t, p.Addr)
	roundTrip(t, c1, "hello")

	p.StallAll()
	c2 := dial(t, p.Addr) // accepted, then black-holed
	write(t, c1, "one")
	write(t, c2, "two")
	expectSilence(t, c2)
	expectSilence(t, c1)
	if got := srv.accepts.Load(); got != 1 {
		t.Fatalf("target accepted %d connections, want 1: a stalled one reached it", got)
	}
	p.waitConns(t, 2, prompt)

	p.Pass()
	expect(t, c1, "one")
	expect(t, c2, "two")
	roundTrip(t, dial(t, p.Addr), "three")
}

func TestProxyDrop(t *testing.T) {
	checkLeaks(t)
	srv := startEcho(t)
	p := StartProxy(t, srv.addr)

	c1 := dial(t, p.Addr)
	roundTrip(t, c1, "hello")
	s1 := srv.next(t)

	p.Drop()
	expectConns(t, p, 0)
	expectClosed(t, c1, syscall.ECONNRESET)
	// The target's side is reset too: the echo server's write fails or its
	// read ends, so it closes and a read of ours on s1 ends.
	expectClosedAny(t, s1)

	// The kernel completes the handshake and the proxy resets the
	// connection on accept, which the dial itself may already report.
	c2, err := net.DialTimeout("tcp", p.Addr, prompt)
	if err == nil {
		defer c2.Close()
		expectClosed(t, c2, syscall.ECONNRESET)
	} else if !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("dial a dropping proxy: %v, want a reset", err)
	}
	expectConns(t, p, 0)

	p.Pass()
	roundTrip(t, dial(t, p.Addr), "back")
}

// expectClosedAny asserts that a read on c promptly fails, however.
func expectClosedAny(t *testing.T, c net.Conn) {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(prompt))
	var b [64]byte
	n, err := c.Read(b[:])
	if n > 0 || err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read %q, %v; want the connection closed", b[:n], err)
	}
}

func TestProxyCloseAll(t *testing.T) {
	checkLeaks(t)
	srv := startEcho(t)
	p := StartProxy(t, srv.addr)

	c1 := dial(t, p.Addr)
	c2 := dial(t, p.Addr)
	roundTrip(t, c1, "one")
	roundTrip(t, c2, "two")
	expectConns(t, p, 2)

	p.CloseAll()
	expectConns(t, p, 0)
	expectClosed(t, c1, io.EOF)
	expectClosed(t, c2, io.EOF)

	c3 := dial(t, p.Addr)
	roundTrip(t, c3, "three")
	expectConns(t, p, 1)
}

func TestProxyConns(t *testing.T) {
	checkLeaks(t)
	srv := startEcho(t)
	p := StartProxy(t, srv.addr)
	expectConns(t, p, 0)

	var cs []net.Conn
	for range 3 {
		c := dial(t, p.Addr)
		roundTrip(t, c, "x")
		cs = append(cs, c)
	}
	expectConns(t, p, 3)

	cs[0].Close()
	p.waitConns(t, 2, prompt)

	// A client's close does not cross a stalled link; Pass lets it through.
	p.Stall()
	cs[1].Close()
	expectSilence(t, cs[2])
	expectConns(t, p, 2)
	p.Pass()
	p.waitConns(t, 1, prompt)
}

// TestProxyClose closes a proxy whose connections are stalled mid-transfer
// and one that waits to be dialed, and checks that no goroutine outlives it.
func TestProxyClose(t *testing.T) {
	srv := startEcho(t)
	ignore := goleak.IgnoreCurrent()
	p := StartProxy(t, srv.addr)

	c1 := dial(t, p.Addr)
	roundTrip(t, c1, "hello")
	p.StallAll()
	write(t, c1, "held")
	c2 := dial(t, p.Addr)
	write(t, c2, "never dialed")
	p.waitConns(t, 2, prompt)

	p.Close()
	expectConns(t, p, 0)
	goleak.VerifyNone(t, ignore)
	// EOF, or RST where the proxy's socket held unread bytes.
	expectClosedAny(t, c1)
	expectClosedAny(t, c2)
	if _, err := net.DialTimeout("tcp", p.Addr, prompt); err == nil {
		t.Fatal("dial a closed proxy: no error")
	}
	p.Close() // idempotent
}

// TestProxyRedis puts the proxy between go-redis and the shared Redis.
func TestProxyRedis(t *testing.T) {
	checkLeaks(t)
	opt, err := redis.ParseURL(env("PUSHD_TEST_REDIS_URL", DefaultRedisURL))
	if err != nil {
		t.Fatalf("PUSHD_TEST_REDIS_URL: %v", err)
	}
	p := StartProxy(t, opt.Addr)
	opt.Addr = p.Addr
	opt.ContextTimeoutEnabled = true
	opt.PoolSize = 1
	c := redis.NewClient(opt)
	t.Cleanup(func() { c.Close() })

	ping := func(d time.Duration) error {
		ctx, cancel := context.WithTimeout(context.Background(), d)
		defer cancel()
		return c.Ping(ctx).Err()
	}
	if err := ping(prompt); err != nil {
		t.Fatalf("PING through the proxy: %v", err)
	}

	// A stalled PING times out; go-redis drops that connection and its
	// next PING redials, which Stall lets through.
	p.Stall()
	if err := ping(silence); !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("PING through a stalled link: %v, want a timeout", err)
	}
	if err := ping(prompt); err != nil {
		t.Fatalf("PING after redial: %v", err)
	}

	p.Drop()
	if err := ping(prompt); err == nil {
		t.Fatal("PING through a dropping proxy: no error")
	}
	p.Pass()
	if err := ping(prompt); err != nil {
		t.Fatalf("PING after Pass: %v", err)
	}
}
