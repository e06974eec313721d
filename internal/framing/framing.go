// Package framing refuses HTTP/1 requests whose framing two parsers may
// read differently: a Content-Length beside a Transfer-Encoding, and header
// lines folded the obsolete way. A proxy in front that frames such a
// request otherwise than the node would let a request be smuggled past it
// (RFC 9112, sections 6.1 and 5.2). net/http takes both silently (it drops
// the Content-Length and joins folded lines) before a handler could tell,
// so the connection's bytes are read here as net/http reads them, one
// verdict per request, which Handler answers 400 with the connection
// closed.
package framing

import (
	"bytes"
	"context"
	"net"
	"net/http"
	"strconv"
	"sync"
	"syscall"

	"github.com/pushd/pushd/internal/httperr"
)

// Listener wraps the connections it accepts in Conns. MaxHead bounds the
// request head read here (the server's MaxHeaderBytes, plus its request
// line); a longer one is net/http's to refuse, and stops the reading here.
type Listener struct {
	net.Listener
	MaxHead int
}

// Accept wraps the next connection.
func (l Listener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &Conn{Conn: c, max: max(l.MaxHead, 4<<10)}, nil
}

// Reading states.
const (
	inHead    = iota // a request's head, up to its blank line
	inBody           // body bytes of a Content-Length still to pass
	inSize           // a chunk-size line
	inChunk          // chunk data, then its CRLF
	inTrailer        // the trailer section, up to its blank line
	off              // not reading: a hijacked, upgraded or unreadable stream
)

// Conn is a connection whose requests are framed here as net/http frames
// them. Read runs on net/http's reading goroutine, verdicts are taken on
// the handlers'.
type Conn struct {
	net.Conn
	max int

	mu       sync.Mutex
	state    int
	line     []byte // the head, or a chunk-size or trailer line, so far
	remain   int64  // body or chunk bytes still to pass (chunk: plus its CRLF)
	verdicts []string
}

// Read reads from the connection and frames what it read.
func (c *Conn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	if n > 0 {
		c.mu.Lock()
		c.frame(b[:n])
		c.mu.Unlock()
	}
	return n, err
}

// SyscallConn and SetWriteBuffer reach the connection's socket, which the
// streams write to directly.
func (c *Conn) SyscallConn() (syscall.RawConn, error) {
	sc, ok := c.Conn.(syscall.Conn)
	if !ok {
		return nil, syscall.EINVAL
	}
	return sc.SyscallConn()
}

// SetWriteBuffer sets the socket's send buffer.
func (c *Conn) SetWriteBuffer(n int) error {
	if tc, ok := c.Conn.(interface{ SetWriteBuffer(int) error }); ok {
		return tc.SetWriteBuffer(n)
	}
	return nil
}

// CloseWrite shuts the socket's sending side, for a close that must let
// what was written arrive before the socket closes.
func (c *Conn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return syscall.EINVAL
}

func (c *Conn) frame(b []byte) {
	for len(b) > 0 && c.state != off {
		switch c.state {
		case inHead:
			if len(c.line) == 0 {
				// Blank lines before a request line are skipped, as net/http does.
				if b = bytes.TrimLeft(b, "\r\n"); len(b) == 0 {
					return
				}
			}
			i := bytes.IndexByte(b, '\n')
			if i < 0 {
				c.line = append(c.line, b...)
				b = nil
			} else {
				start := len(c.line)
				c.line = append(c.line, b[:i+1]...)
				b = b[i+1:]
				if l := c.line[start:]; len(bytes.TrimRight(l, "\r\n")) == 0 {
					c.endHead() // the blank line that ends the head
					continue
				}
			}
			if len(c.line) > c.max {
				c.stop()
			}
		case inBody:
			k := min(int64(len(b)), c.remain)
			b, c.remain = b[k:], c.remain-k
			if c.remain == 0 {
				c.state = inHead
			}
		case inChunk:
			k := min(int64(len(b)), c.remain)
			b, c.remain = b[k:], c.remain-k
			if c.remain == 0 {
				c.state = inSize
			}
		case inSize, inTrailer:
			i := bytes.IndexByte(b, '\n')
			if i < 0 {
				c.line = append(c.line, b...)
				b = nil
				if len(c.line) > 4<<10 {
					c.stop()
				}
				continue
			}
			c.line = append(c.line, b[:i+1]...)
			b = b[i+1:]
			c.endLine()
		}
	}
}

// endLine ends a chunk-size or a trailer line.
func (c *Conn) endLine() {
	line := bytes.TrimRight(c.line, "\r\n")
	c.line = c.line[:0]
	if c.state == inTrailer {
		if len(line) == 0 {
			c.state = inHead
		}
		return
	}
	if i := bytes.IndexByte(line, ';'); i >= 0 {
		line = line[:i]
	}
	size, err := strconv.ParseInt(string(bytes.TrimSpace(line)), 16, 64)
	switch {
	case err != nil || size < 0:
		c.stop() // net/http refuses it and closes
	case size == 0:
		c.state = inTrailer
	default:
		c.remain, c.state = size+2, inChunk // the data and its CRLF
	}
}

// endHead judges a complete request head and frames its body.
func (c *Conn) endHead() {
	head := c.line
	c.line = nil // a stream keeps no buffer
	lines := bytes.Split(bytes.TrimRight(head, "\r\n"), []byte("\n"))
	verdict := ""
	var length, encoding, upgrade bool
	var size int64
	chunked := false
	for _, l := range lines[1:] {
		l = bytes.TrimSuffix(l, []byte("\r"))
		if len(l) > 0 && (l[0] == ' ' || l[0] == '\t') {
			verdict = "a header line folded onto the next (obsolete line folding)"
			continue
		}
		name, value, _ := bytes.Cut(l, []byte(":"))
		value = bytes.TrimSpace(value)
		switch {
		case bytes.EqualFold(name, []byte("Content-Length")):
			length = true
			size, _ = strconv.ParseInt(string(value), 10, 64)
		case bytes.EqualFold(name, []byte("Transfer-Encoding")):
			encoding = true
			codings := bytes.Split(value, []byte(","))
			chunked = bytes.EqualFold(bytes.TrimSpace(codings[len(codings)-1]), []byte("chunked"))
		case bytes.EqualFold(name, []byte("Upgrade")):
			upgrade = true
		}
	}
	if length && encoding {
		verdict = "both Content-Length and Transfer-Encoding"
	}
	c.verdicts = append(c.verdicts, verdict)
	switch {
	case upgrade, bytes.HasPrefix(lines[0], []byte("PRI ")), verdict != "":
		// An upgraded stream is not HTTP/1 any more; a refused request ends
		// its connection.
		c.stop()
	case encoding && chunked:
		c.state = inSize
	case encoding:
		c.stop() // net/http refuses a request coding it cannot read, and closes
	case length && size > 0:
		c.remain, c.state = size, inBody
	}
}

func (c *Conn) stop() {
	c.state, c.line = off, nil
}

// next takes the verdict of the connection's next request: "" for a
// request framed once, or why it is refused.
func (c *Conn) next() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.verdicts) == 0 {
		return "" // not framed here: the reading stopped before it
	}
	v := c.verdicts[0]
	if c.verdicts = c.verdicts[1:]; len(c.verdicts) == 0 {
		c.verdicts = nil // an open stream keeps no slice
	}
	return v
}

type connKey struct{}

// ConnContext is the server's ConnContext: it gives each request its
// connection's verdicts.
func ConnContext(ctx context.Context, c net.Conn) context.Context {
	if fc, ok := c.(*Conn); ok {
		return context.WithValue(ctx, connKey{}, fc)
	}
	return ctx
}

// Handler answers a request framed two ways 400 bad_request and closes its
// connection; it passes the others to next.
func Handler(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if c, ok := r.Context().Value(connKey{}).(*Conn); ok && r.ProtoMajor == 1 {
			if why := c.next(); why != "" {
				w.Header().Set("Connection", "close")
				httperr.Write(w, http.StatusBadRequest, httperr.BadRequest, "the request is framed two ways: "+why)
				return
			}
		}
		next.ServeHTTP(w, r)
	})
}
