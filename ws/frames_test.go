package ws

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/pushd/pushd/hub"
	"github.com/pushd/pushd/internal/testenv"
)

// countingWriter counts the writes that reach the backlog writer: one per
// write(2) when the socket takes them whole.
type countingWriter struct {
	w  io.Writer
	mu sync.Mutex
	n  int
}

func (c *countingWriter) Write(p []byte) (int, error) {
	c.mu.Lock()
	c.n++
	c.mu.Unlock()
	return c.w.Write(p)
}

func (c *countingWriter) writes() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n
}

func countWrites(p *pair) *countingWriter {
	p.sink.out.mu.Lock()
	defer p.sink.out.mu.Unlock()
	cw := &countingWriter{w: p.sink.out.w}
	p.sink.out.w = cw
	return cw
}

// readVersions reads n text frames and checks they carry versions 1..n in
// order.
func readVersions(t *testing.T, p *pair, n int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for v := 1; v <= n; v++ {
		_, data, err := p.client.Read(ctx)
		if err != nil {
			t.Fatalf("frame %d: %v", v, err)
		}
		if want := `"version":` + strconv.Itoa(v) + `,`; !strings.Contains(string(data), want) {
			t.Fatalf("frame %d is %q; want %s", v, data, want)
		}
	}
}

// TestSinkWritesSeveralFramesInOneWrite: the frames of one Write reach the
// socket in one write, whole and in order, and a single frame still goes
// out by itself.
func TestSinkWritesSeveralFramesInOneWrite(t *testing.T) {
	p := newPair(t, 10*time.Second)
	cw := countWrites(p)
	events := make([]hub.Event, 8)
	for i := range events {
		events[i] = taskEvent(t, int64(i+1))
	}
	if _, err := p.sink.Write(events); err != nil {
		t.Fatal(err)
	}
	if n := cw.writes(); n != 1 {
		t.Fatalf("a Write of %d frames made %d writes; want 1", len(events), n)
	}
	readVersions(t, p, len(events))

	if _, err := p.sink.Write(events[:1]); err != nil {
		t.Fatal(err)
	}
	if n := cw.writes(); n != 2 {
		t.Fatalf("after a Write of one frame: %d writes; want 2", n)
	}
	readVersions(t, p, 1)
}

// TestDataFramesAndControlFramesStayWhole: task frames the sink writes and
// control frames written from another goroutine (as the gate writes its
// pongs) share the socket without cutting into each other: the client
// reads every task frame intact and in order, and answers every ping,
// whose pong the server's reader takes.
func TestDataFramesAndControlFramesStayWhole(t *testing.T) {
	p := newPair(t, 10*time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	const writes, pings = 200, 50
	pinged := make(chan error, 1)
	go func() {
		for range pings {
			var b [2]byte
			p.sink.out.writeData(appendControlFrame(b[:0], opPing, nil))
			select {
			case <-p.pongs:
			case <-ctx.Done():
				pinged <- ctx.Err()
				return
			}
		}
		pinged <- nil
	}()
	wrote := make(chan error, 1)
	go func() {
		for i := range writes {
			if _, err := p.sink.Write([]hub.Event{taskEvent(t, int64(2*i+1)), taskEvent(t, int64(2*i+2))}); err != nil {
				wrote <- err
				return
			}
		}
		wrote <- nil
	}()
	readVersions(t, p, 2*writes) // the client's reader answers the pings meanwhile
	if err := <-wrote; err != nil {
		t.Fatal(err)
	}
	// The pings' pongs need the client to keep reading.
	go p.client.Read(ctx)
	if err := <-pinged; err != nil {
		t.Fatalf("ping beside task frames: %v", err)
	}
}

// TestNoDataFrameAfterTheCloseFrame: once coder/websocket sent the close
// frame, a Write fails instead of sending a data frame after it, and the
// client reads the close as the next frame. Its reason is the longest a
// close frame holds, so the frame is the largest control frame there is.
func TestNoDataFrameAfterTheCloseFrame(t *testing.T) {
	p := newPair(t, 10*time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	reason := strings.Repeat("r", maxControlFrame-2-2)    // less the header and the status code
	go p.sink.wc.Close(websocket.StatusGoingAway, reason) // waits for the client's close
	testenv.Eventually(t, "the close frame sent", func() bool { return closeSent(p) })
	if _, err := p.sink.Write([]hub.Event{taskEvent(t, 1)}); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("Write after the close frame: %v; want net.ErrClosed", err)
	}
	_, data, err := p.client.Read(ctx)
	var ce websocket.CloseError
	if !errors.As(err, &ce) || ce.Code != websocket.StatusGoingAway || ce.Reason != reason {
		t.Fatalf("client read %q, %v; want the close frame (1001, a %d-byte reason)", data, err, len(reason))
	}
}

func closeSent(p *pair) bool {
	p.sink.out.mu.Lock()
	defer p.sink.out.mu.Unlock()
	return p.sink.out.closeSent
}

// TestFramesOfEveryLengthForm: a message of each of the three length
// encodings reaches a real client intact.
func TestFramesOfEveryLengthForm(t *testing.T) {
	p := newPair(t, 10*time.Second)
	p.client.SetReadLimit(1 << 20)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, n := range []int{10, 1000, 70_000} {
		msg := strings.Repeat("m", n)
		if _, err := p.sink.Write([]hub.Event{{Kind: hub.KindError, Code: "x", Message: msg}}); err != nil {
			t.Fatal(err)
		}
		_, data, err := p.client.Read(ctx)
		if err != nil || !strings.Contains(string(data), `"message":"`+msg+`"`) {
			t.Fatalf("message of %d bytes: read %d bytes, %v", n, len(data), err)
		}
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
		got := appendTextFrame([]byte("prefix"), p)
		want := append(append([]byte("prefix"), tc.header...), p...)
		if !bytes.Equal(got, want) {
			t.Errorf("payload of %d bytes: header % x; want % x", tc.n, got[6:6+len(tc.header)], tc.header)
		}
	}
}
