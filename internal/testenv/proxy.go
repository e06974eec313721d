package testenv

import (
	"context"
	"errors"
	"io"
	"net"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Proxy is a TCP proxy between a client under test and a real server (Redis,
// PostgreSQL) that injects faults on the wire: stalls, resets and kills.
//
// Stall semantics: while a connection is stalled its copy loops neither read
// nor write, so bytes queue in the kernel buffers (the proxy holds at most
// one 8 KiB chunk per direction) and a client's writes succeed until those
// buffers fill, then block. No EOF or RST crosses a stalled link in either
// direction, and a connection accepted under StallAll is not dialed to the
// target until it is resumed. Pass resumes every stalled connection and
// delivers what was queued, in order, as TCP would after a transient outage.
// Bytes sent before Stall returns may still be delivered; bytes sent after
// it are not, until Pass.
//
// Each method sets the fate of new connections: Pass, Stall and CloseAll
// forward them, StallAll stalls them, Drop resets them on accept.
type Proxy struct {
	// Addr is the host:port clients dial instead of the target.
	Addr string

	target string
	ln     net.Listener
	ctx    context.Context // canceled by Close; bounds upstream dials
	cancel context.CancelFunc
	t      testing.TB
	wg     sync.WaitGroup // the accept loop and both copy loops of every link

	mu      sync.Mutex
	cond    *sync.Cond // on mu; broadcast when a link is resumed or closed
	mode    proxyMode  // guarded by mu: the fate of new connections
	closed  bool       // guarded by mu
	links   map[*link]struct{}
	changed chan struct{} // guarded by mu; closed and replaced when links changes
}

type proxyMode int

const (
	modePass  proxyMode = iota // forward new connections
	modeStall                  // accept new connections, move no byte
	modeDrop                   // reset new connections on accept
)

// proxyChunk is the most one copy loop reads before checking the link's
// state again.
const proxyChunk = 8 << 10

// link is one proxied connection. Its fields are guarded by Proxy.mu.
type link struct {
	client  net.Conn // accepted from the client
	server  net.Conn // dialed to the target; nil until dialed
	stalled bool
	closed  bool
}

// StartProxy listens on a free 127.0.0.1 port and forwards every connection
// to target. It is closed when the test ends: every goroutine has exited and
// every socket is closed.
func StartProxy(t testing.TB, target string) *Proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("testenv: proxy listen: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	p := &Proxy{
		Addr:    ln.Addr().String(),
		target:  target,
		ln:      ln,
		ctx:     ctx,
		cancel:  cancel,
		t:       t,
		links:   make(map[*link]struct{}),
		changed: make(chan struct{}),
	}
	p.cond = sync.NewCond(&p.mu)
	p.wg.Add(1)
	go p.acceptLoop()
	t.Cleanup(p.Close)
	return p
}

// Pass forwards new connections and resumes stalled ones, delivering what
// they queued while stalled. It is the initial state.
func (p *Proxy) Pass() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.mode = modePass
	for l := range p.links {
		l.stalled = false
	}
	p.cond.Broadcast()
}

// Stall turns every existing connection into a half-open link: it stays open
// but no byte moves in either direction until Pass. New connections are
// forwarded, so a client that notices and redials gets a working link.
func (p *Proxy) Stall() { p.stall(modePass) }

// StallAll is Stall that stalls new connections too: they are accepted but
// never reach the target until Pass (a black hole).
func (p *Proxy) StallAll() { p.stall(modeStall) }

func (p *Proxy) stall(mode proxyMode) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.mode = mode
	for l := range p.links {
		l.stalled = true
	}
}

// Drop resets every existing connection at once, on both sides (SO_LINGER
// 0, so peers see RST rather than EOF), and resets new connections as soon as
// they are accepted, until another mode is set.
func (p *Proxy) Drop() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.mode = modeDrop
	for l := range p.links {
		p.closeLinkLocked(l, true)
	}
}

// CloseAll closes every existing connection once, on both sides, as a server
// that kills its clients would (FIN, not RST). New connections are forwarded.
func (p *Proxy) CloseAll() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.mode = modePass
	for l := range p.links {
		p.closeLinkLocked(l, false)
	}
}

// Conns returns the number of connections currently open through the proxy:
// accepted and not yet closed by either side or by the proxy. A stalled
// connection counts until it is resumed or closed by the proxy, since a
// close by its client does not cross a stalled link.
func (p *Proxy) Conns() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.links)
}

// waitConns waits until Conns is n, failing the test after d.
func (p *Proxy) waitConns(t testing.TB, n int, d time.Duration) {
	t.Helper()
	timer := time.NewTimer(d)
	defer timer.Stop()
	for {
		p.mu.Lock()
		got, changed := len(p.links), p.changed
		p.mu.Unlock()
		if got == n {
			return
		}
		select {
		case <-changed:
		case <-timer.C:
			t.Fatalf("testenv: proxy has %d connections after %v, want %d", got, d, n)
		}
	}
}

// Close stops listening, closes every connection and waits for every
// goroutine of the proxy to exit. It may be called more than once.
func (p *Proxy) Close() {
	p.mu.Lock()
	if !p.closed {
		p.closed = true
		p.ln.Close()
		p.cancel()
		for l := range p.links {
			p.closeLinkLocked(l, false)
		}
	}
	p.mu.Unlock()
	p.wg.Wait()
}

func (p *Proxy) acceptLoop() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			p.mu.Lock()
			closed := p.closed
			p.mu.Unlock()
			if !closed {
				p.t.Errorf("testenv: proxy to %s: accept: %v", p.target, err)
			}
			return
		}
		p.mu.Lock()
		switch {
		case p.closed:
			c.Close()
		case p.mode == modeDrop:
			reset(c)
		default:
			l := &link{client: c, stalled: p.mode == modeStall}
			p.links[l] = struct{}{}
			p.notifyLocked()
			p.wg.Add(1)
			go p.serve(l)
		}
		p.mu.Unlock()
	}
}

// serve dials the target for l once l is not stalled, then copies client to
// server while a second goroutine copies server to client, and closes l when
// both directions are done.
func (p *Proxy) serve(l *link) {
	defer p.wg.Done()
	if !p.await(l) {
		return
	}
	var d net.Dialer
	s, err := d.DialContext(p.ctx, "tcp", p.target)
	p.mu.Lock()
	if err != nil || l.closed {
		if err == nil {
			s.Close()
		}
		// The client sees its connection closed, as if the target refused.
		p.closeLinkLocked(l, false)
		p.mu.Unlock()
		return
	}
	l.server = s
	p.mu.Unlock()

	done := make(chan struct{})
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		defer close(done)
		p.copy(l, l.client, s)
	}()
	p.copy(l, s, l.client)
	<-done
	p.mu.Lock()
	p.closeLinkLocked(l, false)
	p.mu.Unlock()
}

// copy moves bytes from src to dst in chunks, checking before each read and
// each write that l is not stalled. EOF from src is passed on as a half-close
// of dst; any other error closes l.
func (p *Proxy) copy(l *link, dst, src net.Conn) {
	buf := make([]byte, proxyChunk)
	for {
		if !p.await(l) {
			return
		}
		n, rerr := src.Read(buf)
		// Whatever was read, and an EOF or error, waits out a stall.
		if !p.await(l) {
			return
		}
		if n > 0 {
			if _, err := dst.Write(buf[:n]); err != nil {
				p.closeLink(l, false)
				return
			}
		}
		switch {
		case rerr == nil:
		case errors.Is(rerr, io.EOF):
			if tc, ok := dst.(*net.TCPConn); ok {
				tc.CloseWrite()
			}
			return
		default:
			// Reset the other side too, so it learns the link failed.
			p.closeLink(l, isReset(rerr))
			return
		}
	}
}

// await blocks while l is stalled and reports whether l is still open.
func (p *Proxy) await(l *link) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	for l.stalled && !l.closed {
		p.cond.Wait()
	}
	return !l.closed
}

func (p *Proxy) closeLink(l *link, rst bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closeLinkLocked(l, rst)
}

// closeLinkLocked closes both sockets of l, with RST if rst, wakes its copy
// loops and forgets it. Closing a closed link does nothing.
func (p *Proxy) closeLinkLocked(l *link, rst bool) {
	if l.closed {
		return
	}
	l.closed = true
	for _, c := range []net.Conn{l.client, l.server} {
		if c == nil {
			continue
		}
		if rst {
			reset(c)
		} else {
			c.Close()
		}
	}
	delete(p.links, l)
	p.notifyLocked()
	p.cond.Broadcast()
}

func (p *Proxy) notifyLocked() {
	close(p.changed)
	p.changed = make(chan struct{})
}

// reset closes c with SO_LINGER 0 so its peer sees RST.
func reset(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		tc.SetLinger(0)
	}
	c.Close()
}

// isReset reports whether err means the peer reset the connection.
func isReset(err error) bool {
	return errors.Is(err, syscall.ECONNRESET)
}
