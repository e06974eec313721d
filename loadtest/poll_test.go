package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/coder/websocket"
)

// pollerWorker is a test worker whose established streams a poller reads,
// closed at the end of the test.
func pollerWorker(t *testing.T, centrifugo bool, url string) *worker {
	t.Helper()
	p, err := newPoller()
	if err != nil {
		t.Fatal(err)
	}
	if p == nil {
		t.Skip("no poller on this system")
	}
	t.Cleanup(p.close)
	w := testWorker(centrifugo)
	w.poller, w.urls = p, []string{url}
	return w
}

// runSession runs one session, c.sessionSSE or c.sessionWS, and waits
// for its end, whoever reads it.
func runSession(session func(sessionEnd)) (established bool, err error) {
	type outcome struct {
		established bool
		err         error
	}
	ended := make(chan outcome, 1)
	session(func(established bool, err error) { ended <- outcome{established, err} })
	o := <-ended
	return o.established, o.err
}

func taskJSON(v int) string {
	return fmt.Sprintf(`{"type":"task","task_id":"lt_3","version":%d,"sent_ns":1}`, v)
}

// TestPollerWS runs a pushd WebSocket session the poller reads: two task
// messages, a ping the server waits for the pong of, a third, a close.
func TestPollerWS(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		wc, err := websocket.Accept(rw, r, &websocket.AcceptOptions{Subprotocols: []string{"pushd.v1"}})
		if err != nil {
			return
		}
		defer wc.CloseNow()
		ctx, cancel := context.WithTimeout(r.Context(), 10*time.Second)
		defer cancel()
		if _, sub, err := wc.Read(ctx); err != nil || string(sub) != `{"op":"subscribe","id":1,"tasks":["lt_3"]}` {
			t.Errorf("subscribe %q, %v", sub, err)
			return
		}
		ctx = wc.CloseRead(ctx) // reads the pong
		wc.Write(ctx, websocket.MessageText, []byte(`{"type":"ack","id":1}`))
		wc.Write(ctx, websocket.MessageText, []byte(taskJSON(1)))
		wc.Write(ctx, websocket.MessageText, []byte(taskJSON(2)))
		if err := wc.Ping(ctx); err != nil {
			t.Errorf("ping: %v", err)
		}
		wc.Write(ctx, websocket.MessageText, []byte(taskJSON(3)))
		wc.Close(websocket.StatusGoingAway, "restart")
	}))
	defer srv.Close()
	w := pollerWorker(t, false, srv.URL)
	c := &conn{w: w, task: 3, token: "t", ws: true}
	established, err := runSession(c.sessionWS)
	if !established || websocket.CloseStatus(err) != websocket.StatusGoingAway {
		t.Fatalf("session: established %v, %v; want established and close 1001", established, err)
	}
	if got, n := c.last.Load(), w.deliveriesForTest(); got != 3 || n != 3 {
		t.Errorf("last version %d after %d deliveries, want 3 and 3", got, n)
	}
	if errKind(err, established) != "ws_close_1001" || len(w.errs) != 0 {
		t.Errorf("kind %s, client counts %v", errKind(err, established), w.errs)
	}
}

// TestPollerCentrifugoWS runs TestCentrifugoWS's sessions through the
// poller: the connect reply, a frame of two messages, a ping answered with
// {}, a refused token.
func TestPollerCentrifugoWS(t *testing.T) {
	ponged := make(chan bool, 1)
	srv := centrifugoWSServer(t, ponged)
	w := pollerWorker(t, true, srv.URL)
	c := &conn{w: w, task: 3, token: "good", ws: true}
	opened := 0
	c.first = func(error) { opened++ }
	established, err := runSession(c.sessionWS)
	if !established || websocket.CloseStatus(err) != websocket.StatusNormalClosure {
		t.Fatalf("session: established %v, %v; want established and a normal close", established, err)
	}
	if opened != 1 {
		t.Errorf("opened %d times, want once", opened)
	}
	if !<-ponged {
		t.Error("the ping got no pong")
	}
	if got, n := c.last.Load(), w.deliveriesForTest(); got != 3 || n != 3 {
		t.Errorf("last version %d after %d deliveries, want 3 and 3", got, n)
	}
	c = &conn{w: w, task: 3, token: "bad", ws: true}
	established, err = runSession(c.sessionWS)
	if established || errKind(err, established) != "centrifugo_error_3500" {
		t.Errorf("refused connect: established %v, %v, want centrifugo_error_3500", established, err)
	}
}

// TestPollerSSE reads a chunked event stream, as net/http serves one
// (Centrifugo's uni_sse), to its last chunk; then a stream that stays
// open, ended by the client's close.
func TestPollerSSE(t *testing.T) {
	wrote, hold := make(chan struct{}), make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		rw.Header().Set("Content-Type", "text/event-stream")
		resumed := r.Header.Get("Last-Event-ID") == "lt_3=3"
		from := 1
		if resumed {
			from = 4
		}
		for v := from; v < from+3; v++ {
			fmt.Fprintf(rw, "event: task\nid: lt_3=%d\ndata: %s\n\n", v, taskJSON(v))
			rw.(http.Flusher).Flush()
		}
		if resumed {
			close(wrote)
			select { // stay open until the client leaves
			case <-r.Context().Done():
				close(hold)
			case <-time.After(10 * time.Second):
			}
		}
	}))
	defer srv.Close()
	w := pollerWorker(t, false, srv.URL)
	c := &conn{w: w, task: 3, token: "t"}
	established, err := runSession(c.sessionSSE)
	if !established || !errors.Is(err, io.EOF) {
		t.Fatalf("session: established %v, %v; want established and EOF at the last chunk", established, err)
	}
	if got := c.last.Load(); got != 3 || string(c.cursor) != "lt_3=3" {
		t.Errorf("last version %d, cursor %q", got, c.cursor)
	}

	c.phys = 0 // as attempt does before each physical connection
	ended := make(chan error, 1)
	c.sessionSSE(func(_ bool, err error) { ended <- err })
	<-wrote
	c.close()
	select {
	case <-ended:
	case <-time.After(10 * time.Second):
		t.Fatal("close did not end the session")
	}
	select {
	case <-hold:
	case <-time.After(10 * time.Second):
		t.Fatal("the server did not see the client leave")
	}
	if n := w.regressions.Load(); n != 0 {
		t.Errorf("%d regressions", n)
	}
	if got := c.last.Load(); got > 6 || got < 3 {
		t.Errorf("last version %d", got)
	}
}

// TestPollerSeesTheEnd: a server that writes its last event and closes at
// once, so that the bytes and the end of the stream are ready together,
// ends every session; a reader that stopped at the short read would wait
// for an edge that never comes.
func TestPollerSeesTheEnd(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() { // ends when the listener closes
		for {
			nc, err := ln.Accept()
			if err != nil {
				return
			}
			http.ReadRequest(bufio.NewReader(nc)) // read, so that the close is a FIN and not a reset
			io.WriteString(nc, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\r\n")
			time.Sleep(2 * time.Millisecond) // the head alone first: the poller is then waiting
			io.WriteString(nc, "event: task\ndata: "+taskJSON(1)+"\n\n")
			nc.Close()
		}
	}()
	w := pollerWorker(t, false, "http://"+ln.Addr().String())
	for i := range 50 {
		c := &conn{w: w, task: 3, token: "t"}
		ended := make(chan error, 1)
		c.sessionSSE(func(_ bool, err error) { ended <- err })
		select {
		case err := <-ended:
			if !errors.Is(err, io.EOF) {
				t.Fatalf("session %d: %v, want EOF", i, err)
			}
		case <-time.After(10 * time.Second):
			c.close()
			t.Fatalf("session %d did not end with the stream", i)
		}
	}
}
