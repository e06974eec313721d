package fanout

import (
	"net"
	"sync"
	"testing"
	"time"
)

// latencyProxy forwards TCP connections to a server, delaying every byte by
// a fixed latency in each direction, as a distant Redis would. It makes a
// race between a SUBSCRIBE and a PUBLISH sent right after it observable on
// one machine.
type latencyProxy struct {
	Addr string

	ln      net.Listener
	target  string
	latency time.Duration
	wg      sync.WaitGroup

	mu     sync.Mutex
	closed bool
	conns  []net.Conn
}

func startLatencyProxy(t *testing.T, target string, latency time.Duration) *latencyProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &latencyProxy{Addr: ln.Addr().String(), ln: ln, target: target, latency: latency}
	p.wg.Go(p.accept)
	t.Cleanup(p.close)
	return p
}

func (p *latencyProxy) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		s, err := net.Dial("tcp", p.target)
		if err != nil {
			c.Close()
			continue
		}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			c.Close()
			s.Close()
			return
		}
		p.conns = append(p.conns, c, s)
		p.mu.Unlock()
		p.wg.Go(func() { p.pipe(s, c) })
		p.wg.Go(func() { p.pipe(c, s) })
	}
}

// pipe copies src to dst, each chunk latency after it was read.
func (p *latencyProxy) pipe(dst, src net.Conn) {
	type chunk struct {
		b  []byte
		at time.Time
	}
	chunks := make(chan chunk, 1024)
	p.wg.Go(func() {
		defer close(chunks)
		for {
			buf := make([]byte, 32<<10)
			n, err := src.Read(buf)
			if n > 0 {
				chunks <- chunk{buf[:n], time.Now().Add(p.latency)}
			}
			if err != nil {
				return
			}
		}
	})
	for c := range chunks {
		time.Sleep(time.Until(c.at)) // the latency being simulated
		if _, err := dst.Write(c.b); err != nil {
			src.Close() // ends the reader; drain what it queued
		}
	}
	dst.Close()
}

func (p *latencyProxy) close() {
	p.ln.Close()
	p.mu.Lock()
	p.closed = true
	for _, c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}
