package main

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/coder/websocket"
)

// sessionSSE runs one physical EventSource connection: GET /v1/events over a
// socket of its own (no http.Transport, whose two goroutines per connection
// a worker holding thousands cannot afford), parsing the stream by hand.
// established reports whether the server answered 200.
func (c *conn) sessionSSE(first *func(error)) (established bool, err error) {
	addr := strings.TrimPrefix(c.w.nodeURL(c.id), "http://")
	nc, err := c.w.dialers[c.id%len(c.w.dialers)].Dial("tcp", addr)
	if err != nil {
		return false, err
	}
	if !c.setCloser(nc) {
		return false, nil
	}
	defer nc.Close()

	req := c.sseRequest(make([]byte, 0, 512), addr)
	nc.SetDeadline(time.Now().Add(15 * time.Second))
	if _, err := nc.Write(req); err != nil {
		return false, err
	}
	br := bufio.NewReaderSize(nc, 2048)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		return false, err
	}
	if resp.StatusCode != http.StatusOK {
		io.Copy(io.Discard, io.LimitReader(resp.Body, 4096))
		return false, statusError{resp.StatusCode}
	}
	nc.SetDeadline(time.Time{})
	c.opened(first)
	lr := br // a body that runs to the end of the connection is read in place
	if len(resp.TransferEncoding) > 0 || resp.ContentLength >= 0 {
		lr = bufio.NewReaderSize(resp.Body, 4096)
	}
	return true, c.readSSE(lr)
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
	req = append(req, " HTTP/1.1\r\nHost: "...)
	req = append(req, addr...)
	req = append(req, "\r\nAccept: text/event-stream\r\nAuthorization: Bearer "...)
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

// readSSE dispatches events until the stream ends. Only what the loadtest
// needs is parsed: event, id, data, comments.
func (c *conn) readSSE(r *bufio.Reader) error {
	var data, scratch []byte
	kind, hasData := sseMessage, false
	for {
		line, err := readLine(r, &scratch)
		if err != nil {
			return err
		}
		if len(line) == 0 { // dispatch
			if hasData {
				now := time.Now().UnixNano()
				switch kind {
				case sseTask:
					c.onTask(data, now)
				case sseMode:
					c.onMode(data, now)
				case sseError:
					c.onError(data)
				case sseReconnect:
					c.w.countErr("reconnect_event")
				case sseMessage:
					// pushd names every event it sends.
					if c.w.centrifugo {
						c.onCentrifugo(data, now)
					}
				}
			}
			data, kind, hasData = data[:0], sseMessage, false
			continue
		}
		if line[0] == ':' { // comment: heartbeat
			continue
		}
		field, value := line, []byte(nil)
		if i := bytes.IndexByte(line, ':'); i >= 0 {
			field, value = line[:i], line[i+1:]
			if len(value) > 0 && value[0] == ' ' {
				value = value[1:]
			}
		}
		switch string(field) {
		case "event":
			switch string(value) {
			case "task":
				kind = sseTask
			case "mode":
				kind = sseMode
			case "error":
				kind = sseError
			case "reconnect":
				kind = sseReconnect
			default:
				kind = sseOther
			}
		case "data":
			if hasData {
				data = append(data, '\n')
			}
			data = append(data, value...)
			hasData = true
		case "id":
			c.cursor = append(c.cursor[:0], value...)
		}
	}
}

// readLine returns the next line without its line ending; a line longer than
// the reader's buffer is assembled in scratch.
func readLine(r *bufio.Reader, scratch *[]byte) ([]byte, error) {
	line, err := r.ReadSlice('\n')
	if err == bufio.ErrBufferFull {
		*scratch = append((*scratch)[:0], line...)
		for err == bufio.ErrBufferFull {
			line, err = r.ReadSlice('\n')
			*scratch = append(*scratch, line...)
		}
		line = *scratch
	}
	if err != nil {
		return nil, err
	}
	line = line[:len(line)-1]
	if n := len(line); n > 0 && line[n-1] == '\r' {
		line = line[:n-1]
	}
	return line, nil
}

type closerFunc func() error

func (f closerFunc) Close() error { return f() }

// sessionWS runs one physical WebSocket connection: handshake with
// subprotocol pushd.v1, subscribe (with "since" after a reconnect), then
// read frames on this goroutine; coder/websocket answers pings while it
// reads and needs no goroutine of its own. Against Centrifugo it speaks
// Centrifugo's protocol instead (centrifugoWS).
func (c *conn) sessionWS(first *func(error)) (established bool, err error) {
	path, protocols := "/v1/ws", []string{"pushd.v1"}
	hdr := http.Header{"Authorization": {"Bearer " + c.token}}
	if c.w.centrifugo {
		// JSON is Centrifugo's default protocol, asked for by no
		// subprotocol; the token goes in the connect command.
		path, protocols, hdr = "/connection/websocket", nil, nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	wc, resp, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(c.w.nodeURL(c.id), "http")+path, &websocket.DialOptions{
		HTTPClient:      c.w.clients[c.id%len(c.w.clients)],
		HTTPHeader:      hdr,
		Subprotocols:    protocols,
		CompressionMode: websocket.CompressionDisabled,
	})
	cancel()
	if err != nil {
		if resp != nil && resp.StatusCode != http.StatusSwitchingProtocols {
			return false, statusError{resp.StatusCode}
		}
		return false, err
	}
	if !c.setCloser(closerFunc(wc.CloseNow)) {
		return false, nil
	}
	defer wc.CloseNow()
	wc.SetReadLimit(1 << 20)
	if c.w.centrifugo {
		return c.centrifugoWS(wc, first)
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
		return false, err
	}
	c.opened(first)

	buf := make([]byte, 0, 1024)
	for {
		if buf, err = readWS(wc, buf); err != nil {
			return true, err
		}
		now := time.Now().UnixNano()
		switch {
		case bytes.HasPrefix(buf, []byte(`{"type":"task"`)):
			c.onTask(buf, now)
		case bytes.HasPrefix(buf, []byte(`{"type":"mode"`)):
			c.onMode(buf, now)
		case bytes.HasPrefix(buf, []byte(`{"type":"error"`)):
			c.onError(buf)
		case bytes.HasPrefix(buf, []byte(`{"type":"reconnect"`)):
			c.w.countErr("reconnect_event")
		case bytes.HasPrefix(buf, []byte(`{"type":"ack"`)):
			if i := bytes.Index(buf, []byte(`"rejected":[{`)); i >= 0 {
				code, _ := jsonString(buf[i:], `"code":"`)
				c.w.countErr("rejected_" + code)
			}
		}
	}
}

// centrifugoWS speaks Centrifugo's bidirectional JSON protocol as
// centrifuge-js does: the connect command with the token (whose channels
// claim subscribes the connection), its reply, then pushes until the
// connection ends. One frame may carry several messages, a line each; the
// server's ping is an empty message, {}, which the client answers with one.
func (c *conn) centrifugoWS(wc *websocket.Conn, first *func(error)) (established bool, err error) {
	if err := writeWS(wc, centrifugoConnect(c.token)); err != nil {
		return false, err
	}
	buf := make([]byte, 0, 1024)
	for {
		if buf, err = readWS(wc, buf); err != nil {
			if code := websocket.CloseStatus(err); !established && code != -1 {
				return false, centrifugoError{int64(code)} // a refused connect: 3500 invalid token, ...
			}
			return established, err
		}
		now := time.Now().UnixNano()
		for msg := range bytes.SplitSeq(buf, []byte("\n")) {
			switch {
			case len(msg) == 0:
			case string(msg) == "{}":
				if err := writeWS(wc, []byte("{}")); err != nil {
					return established, err
				}
			case !established:
				if !bytes.HasPrefix(msg, []byte(`{"id":1,"connect":`)) {
					code, _ := jsonInt(msg, `"code":`)
					return false, centrifugoError{code}
				}
				established = true
				c.opened(first)
			default:
				c.onCentrifugo(msg, now)
			}
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
