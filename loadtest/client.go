package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/coder/websocket"
)

// sessionEnd takes the outcome of one physical connection, once:
// established reports whether the server accepted it (pushd answered the
// GET with 200, the WebSocket subscribe was sent, Centrifugo replied to
// connect), err what ended it.
type sessionEnd func(established bool, err error)

// sessionSSE runs one physical EventSource connection: GET /v1/events over a
// socket of its own (no http.Transport, whose two goroutines per connection
// a worker holding thousands cannot afford), parsing the stream by hand.
// Once the server answered, the worker's poller reads the stream where
// there is one (Linux), else a goroutine of the session's own; sessionSSE
// returns then, and end is called when the stream ends.
func (c *conn) sessionSSE(end sessionEnd) {
	nc, addr, err := c.dial()
	if nc == nil {
		end(false, err)
		return
	}
	br, resp, err := c.getSSE(nc, addr)
	if err != nil {
		nc.Close()
		end(false, err)
		return
	}
	c.opened()
	done := func(err error) { end(true, err) }
	chunked := len(resp.TransferEncoding) == 1 && resp.TransferEncoding[0] == "chunked"
	if p := c.w.poller; p != nil && resp.ContentLength < 0 && (chunked || len(resp.TransferEncoding) == 0) {
		// What br holds past the head is the body's start, chunked or not.
		var f feeder = &sseParser{c: c}
		if chunked {
			f = &dechunker{next: f}
		}
		p.serve(c, nc, nc.Close, pending(br), func(*pconn) feeder { return f }, done)
		return
	}
	var body io.Reader = br // a body that runs to the end of the connection is read in place
	if len(resp.TransferEncoding) > 0 || resp.ContentLength >= 0 {
		body = resp.Body
	}
	c.readAlone(nc.Close, done, func() error { return c.readSSE(body) })
}

// getSSE sends the GET that opens the stream and reads the answer's head.
func (c *conn) getSSE(nc net.Conn, addr string) (*bufio.Reader, *http.Response, error) {
	req := c.sseRequest(make([]byte, 0, 512), addr)
	nc.SetDeadline(time.Now().Add(15 * time.Second))
	if _, err := nc.Write(req); err != nil {
		return nil, nil, err
	}
	br := bufio.NewReaderSize(nc, 2048)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		return nil, nil, err
	}
	if resp.StatusCode != http.StatusOK {
		io.Copy(io.Discard, io.LimitReader(resp.Body, 4096))
		return nil, nil, refused(resp)
	}
	nc.SetDeadline(time.Time{})
	return br, resp, nil
}

// readAlone reads an established session on a goroutine of its own, where
// there is no poller: read returns when the stream ends, closeConn then
// closes the socket, and done takes what ended it.
func (c *conn) readAlone(closeConn func() error, done func(error), read func() error) {
	started := c.w.dialq.goRead(func() {
		err := read()
		closeConn()
		done(err)
	})
	if !started {
		closeConn()
		done(errWorkerClosed)
	}
}

// pending returns what br has read and not handed out, emptying it.
func pending(br *bufio.Reader) []byte {
	b, _ := br.Peek(br.Buffered())
	b = bytes.Clone(b)
	br.Discard(len(b))
	return b
}

// dial opens the connection's socket to its node from its worker's
// source address and makes it what close closes. A nil nc with a nil
// error means the connection is closing. A node that refuses the
// connection (killed, or restarting) is passed over for another, picked at
// random, as a balancer retrying the next backend does: each node at most
// once per attempt, and the connection stays with the node that took it.
func (c *conn) dial() (nc net.Conn, addr string, err error) {
	others, home, from := int32(len(c.w.urls)-1), c.node.Load(), int32(-1)
	for moved := int32(0); ; moved++ {
		addr = strings.TrimPrefix(c.w.urls[c.nodeIndex()], "http://")
		nc, err = c.w.dialers[c.id%len(c.w.dialers)].DialContext(c.w.dialq.context(), "tcp", addr)
		if err == nil || moved == others || !errors.Is(err, syscall.ECONNREFUSED) {
			break
		}
		if from < 0 {
			from = rand.Int32N(others)
		}
		c.node.Store(home + 1 + (from+moved)%others) // the other nodes, each once
	}
	if err != nil {
		return nil, addr, err
	}
	if !c.setCloser(nc) { // it closed nc
		return nil, addr, nil
	}
	return nc, addr, nil
}

// sseRequest appends the GET that opens the stream: pushd's /v1/events
// with the token in Authorization and Last-Event-ID after a reconnect, or
// Centrifugo's uni_sse with the connect request, its token, in cf_connect
// (a uni_sse client resumes nothing: without history there is nothing to
// resume from).
func (c *conn) sseRequest(req []byte, addr string) []byte {
	if c.w.centrifugo {
		req = append(req, "GET /connection/uni_sse?cf_connect="...)
		req = append(req, url.QueryEscape(`{"token":"`+c.token+`"}`)...)
		req = append(req, " HTTP/1.1\r\nHost: "...)
		req = append(req, addr...)
		return append(req, "\r\nAccept: text/event-stream\r\n\r\n"...)
	}
	req = append(req, "GET /v1/events?task="...)
	req = append(req, taskID(int(c.task))...)
	if c.w.deltas {
		req = append(req, "&deltas=merge"...)
	}
	req = append(req, " HTTP/1.1\r\nHost: "...)
	req = append(req, addr...)
	// No Accept: text/event-stream: pushd answers a request with it that is
	// refused for a while in a short stream an EventSource retries by
	// itself, and the load test counts refusals by their status.
	req = append(req, "\r\nAuthorization: Bearer "...)
	req = append(req, c.token...)
	if len(c.cursor) > 0 {
		req = append(req, "\r\nLast-Event-ID: "...)
		req = append(req, c.cursor...)
	}
	return append(req, "\r\n\r\n"...)
}

type sseKind int

const (
	sseMessage sseKind = iota // no event field: what Centrifugo sends
	sseOther
	sseTask
	sseMode
	sseError
	sseReconnect
)

// onSSE dispatches one event read at recv (Unix ns).
func (c *conn) onSSE(kind sseKind, data []byte, recv int64) {
	switch kind {
	case sseTask:
		c.onTask(data, recv)
	case sseMode:
		c.onMode(data, recv)
	case sseError:
		c.onError(data)
	case sseReconnect:
		c.w.countErr("reconnect_event")
	case sseMessage:
		// pushd names every event it sends.
		if c.w.centrifugo {
			c.onCentrifugo(data, recv)
		}
	}
}

// readSSE dispatches events until the stream ends, reading on the calling
// goroutine.
func (c *conn) readSSE(r io.Reader) error {
	return readInto(r, &sseParser{c: c}, make([]byte, 4096))
}

// readInto feeds f what r reads until either fails.
func readInto(r io.Reader, f feeder, buf []byte) error {
	for {
		n, err := r.Read(buf)
		if n > 0 {
			if ferr := f.feed(buf[:n], time.Now().UnixNano()); ferr != nil {
				return ferr
			}
		}
		if err != nil {
			return err
		}
	}
}

type closerFunc func() error

func (f closerFunc) Close() error { return f() }

// sessionWS runs one physical WebSocket connection: handshake with
// subprotocol pushd.v1 over a socket of its own, subscribe (with "since"
// after a reconnect), then read frames. The worker's poller reads them
// where there is one (Linux), answering pings; elsewhere a goroutine of the
// session's own reads them with coder/websocket, which answers pings while
// it reads. sessionWS returns once the stream is handed over, and end is
// called when it ends. Against Centrifugo it speaks Centrifugo's protocol
// instead (centrifugoSession).
func (c *conn) sessionWS(end sessionEnd) {
	nc, addr, err := c.dial()
	if nc == nil {
		end(false, err)
		return
	}
	wc, early, deflate, err := c.dialWS(nc, addr)
	if err != nil {
		nc.Close()
		end(false, err)
		return
	}
	if c.w.centrifugo {
		if err := writeWS(wc, centrifugoConnect(c.token)); err != nil {
			wc.CloseNow()
			end(false, err)
			return
		}
		cs := &centrifugoSession{c: c}
		done := func(err error) { end(cs.result(err)) }
		if p := c.w.poller; p != nil {
			p.serve(c, nc, wc.CloseNow, early, func(pc *pconn) feeder {
				return &wsParser{onMessage: cs.message(pc.writeText), send: pc.write}
			}, done)
			return
		}
		c.readAlone(wc.CloseNow, done, func() error { return c.centrifugoWS(wc, cs) })
		return
	}

	id := taskID(int(c.task))
	msg := make([]byte, 0, 128)
	msg = append(msg, `{"op":"subscribe","id":1,"tasks":["`...)
	msg = append(msg, id...)
	msg = append(msg, `"]`...)
	if last := c.last.Load(); last > 0 {
		msg = append(msg, `,"since":{"`...)
		msg = append(msg, id...)
		msg = append(msg, `":`...)
		msg = strconv.AppendInt(msg, last, 10)
		msg = append(msg, '}')
	}
	msg = append(msg, '}')
	if err := writeWS(wc, msg); err != nil {
		wc.CloseNow()
		end(false, err)
		return
	}
	c.opened()
	done := func(err error) { end(true, err) }
	if p := c.w.poller; p != nil {
		p.serve(c, nc, wc.CloseNow, early, func(pc *pconn) feeder {
			return &wsParser{onMessage: c.onWS, send: pc.write, deflate: deflate}
		}, done)
		return
	}
	c.readAlone(wc.CloseNow, done, func() error {
		buf := make([]byte, 0, 1024)
		for {
			var err error
			if buf, err = readWS(wc, buf); err != nil {
				return err
			}
			c.onWS(buf, time.Now().UnixNano())
		}
	})
}

// dialWS runs the WebSocket handshake on nc, pushd's or Centrifugo's.
// early is what was read past the handshake, for the poller; deflate
// says the server agreed to compress; wc, closed with CloseNow, closes nc
// as well.
func (c *conn) dialWS(nc net.Conn, addr string) (wc *websocket.Conn, early []byte, deflate bool, err error) {
	path, protocols := "/v1/ws", []string{"pushd.v1"}
	if c.w.deltas {
		path += "?deltas=merge"
	}
	hdr := http.Header{"Authorization": {"Bearer " + c.token}}
	if c.w.centrifugo {
		// JSON is Centrifugo's default protocol, asked for by no
		// subprotocol; the token goes in the connect command.
		path, protocols, hdr = "/connection/websocket", nil, nil
	}
	nc.SetDeadline(time.Now().Add(15 * time.Second))
	hs := &oneConn{nc: nc, br: bufio.NewReaderSize(nc, 1024)}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	mode := websocket.CompressionDisabled
	if c.w.deflate {
		mode = websocket.CompressionNoContextTakeover
	}
	wc, resp, err := websocket.Dial(ctx, "ws://"+addr+path, &websocket.DialOptions{
		HTTPClient:      &http.Client{Transport: hs},
		HTTPHeader:      hdr,
		Subprotocols:    protocols,
		CompressionMode: mode,
	})
	cancel()
	if err != nil {
		if resp != nil && resp.StatusCode != http.StatusSwitchingProtocols {
			return nil, nil, false, refused(resp)
		}
		return nil, nil, false, err
	}
	nc.SetDeadline(time.Time{})
	wc.SetReadLimit(maxEvent)
	if c.w.poller != nil {
		early = pending(hs.br)
	}
	deflate = strings.HasPrefix(resp.Header.Get("Sec-WebSocket-Extensions"), "permessage-deflate")
	return wc, early, deflate, nil
}

// onWS dispatches one pushd message read at recv (Unix ns).
func (c *conn) onWS(msg []byte, recv int64) error {
	switch {
	case bytes.HasPrefix(msg, []byte(`{"type":"task"`)), bytes.HasPrefix(msg, []byte(`{"type":"patch"`)):
		// A patch's first "version" is the one it makes: onTask reads it.
		c.onTask(msg, recv)
	case bytes.HasPrefix(msg, []byte(`{"type":"mode"`)):
		c.onMode(msg, recv)
	case bytes.HasPrefix(msg, []byte(`{"type":"error"`)):
		c.onError(msg)
	case bytes.HasPrefix(msg, []byte(`{"type":"reconnect"`)):
		c.w.countErr("reconnect_event")
	case bytes.HasPrefix(msg, []byte(`{"type":"ack"`)):
		if i := bytes.Index(msg, []byte(`"rejected":[{`)); i >= 0 {
			code, _ := jsonString(msg[i:], `"code":"`)
			c.w.countErr("rejected_" + code)
		}
	}
	return nil
}

// oneConn is an http.RoundTripper over one connection already dialed: it
// lets coder/websocket run the handshake on a socket the loadtest owns,
// whose descriptor the poller can take afterwards. The response to an
// upgrade keeps reading from br, which may hold the first bytes after the
// head.
type oneConn struct {
	nc net.Conn
	br *bufio.Reader
}

func (o *oneConn) RoundTrip(req *http.Request) (*http.Response, error) {
	if err := req.Write(o.nc); err != nil {
		return nil, err
	}
	resp, err := http.ReadResponse(o.br, req)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode == http.StatusSwitchingProtocols {
		resp.Body = upgraded{o.br, o.nc}
	}
	return resp, nil
}

// upgraded is the body of a 101 response as net/http's Transport gives
// it: the connection itself, read through the buffer that read the head.
type upgraded struct {
	br *bufio.Reader
	nc net.Conn
}

func (u upgraded) Read(p []byte) (int, error)  { return u.br.Read(p) }
func (u upgraded) Write(p []byte) (int, error) { return u.nc.Write(p) }
func (u upgraded) Close() error                { return u.nc.Close() }

// centrifugoSession is the client's side of Centrifugo's bidirectional
// JSON protocol as centrifuge-js speaks it: the connect command with the
// token (whose channels claim subscribes the connection), its reply, then
// pushes until the connection ends. One frame may carry several messages,
// a line each; the server's ping is an empty message, {}, which the client
// answers with one. Whoever reads the connection owns it.
type centrifugoSession struct {
	c           *conn
	established bool // the connect reply arrived
}

// message returns the handler of one frame's messages, pong sending a
// text message.
func (s *centrifugoSession) message(pong func([]byte) error) func([]byte, int64) error {
	return func(frame []byte, now int64) error {
		for msg := range bytes.SplitSeq(frame, []byte("\n")) {
			switch {
			case len(msg) == 0:
			case string(msg) == "{}":
				if err := pong([]byte("{}")); err != nil {
					return err
				}
			case !s.established:
				if !bytes.HasPrefix(msg, []byte(`{"id":1,"connect":`)) {
					code, _ := jsonInt(msg, `"code":`)
					return centrifugoError{code}
				}
				s.established = true
				s.c.opened()
			default:
				s.c.onCentrifugo(msg, now)
			}
		}
		return nil
	}
}

// result is the session's outcome given the error that ended it: a close
// before the connect reply is a refused connect (3500 invalid token, ...).
func (s *centrifugoSession) result(err error) (established bool, _ error) {
	if code := websocket.CloseStatus(err); !s.established && code != -1 {
		return false, centrifugoError{int64(code)}
	}
	return s.established, err
}

// centrifugoWS reads a Centrifugo session on this goroutine, until the
// error that ends it, which s.result reads.
func (c *conn) centrifugoWS(wc *websocket.Conn, s *centrifugoSession) error {
	onFrame := s.message(func(msg []byte) error { return writeWS(wc, msg) })
	buf := make([]byte, 0, 1024)
	for {
		var err error
		if buf, err = readWS(wc, buf); err != nil {
			return err
		}
		if err := onFrame(buf, time.Now().UnixNano()); err != nil {
			return err
		}
	}
}

// writeWS writes one text message, within 10 s.
func writeWS(wc *websocket.Conn, msg []byte) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return wc.Write(ctx, websocket.MessageText, msg)
}

// readWS reads the next message into buf, reused.
func readWS(wc *websocket.Conn, buf []byte) ([]byte, error) {
	_, r, err := wc.Reader(context.Background())
	if err != nil {
		return buf, err
	}
	return readAll(r, buf[:0])
}

// readAll appends r to buf, growing it as needed.
func readAll(r io.Reader, buf []byte) ([]byte, error) {
	for {
		if len(buf) == cap(buf) {
			buf = append(buf, 0)[:len(buf)]
		}
		n, err := r.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if err == io.EOF {
			return buf, nil
		}
		if err != nil {
			return buf, err
		}
	}
}
