package ws

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/pushd/pushd/hub"
	"github.com/pushd/pushd/snapshot"
	"github.com/pushd/pushd/ws/internal/wire"
)

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
	events := make([]hub.Event, 8)
	for i := range events {
		events[i] = taskEvent(t, int64(i+1))
	}
	if _, err := p.sink.Write(events); err != nil {
		t.Fatal(err)
	}
	if n := p.writes.Load(); n != 1 {
		t.Fatalf("a Write of %d frames made %d writes; want 1", len(events), n)
	}
	readVersions(t, p, len(events))

	if _, err := p.sink.Write(events[:1]); err != nil {
		t.Fatal(err)
	}
	if n := p.writes.Load(); n != 2 {
		t.Fatalf("after a Write of one frame: %d writes; want 2", n)
	}
	readVersions(t, p, 1)
}

// TestDataFramesAndControlFramesStayWhole: task frames the sink writes and
// control frames written from another goroutine (as the reader writes its
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
			p.sink.wc.WriteFrames(wire.AppendControl(b[:0], wire.OpPing, nil))
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

// TestCompressedOncePerVersion: a version goes compressed to every client
// that negotiated compression, compressed once for all of them, and
// uncompressed to a client that did not offer it; each reads the same
// message.
func TestCompressedOncePerVersion(t *testing.T) {
	pairs := []*pair{openPair(t, 10*time.Second, true), openPair(t, 10*time.Second, true), newPair(t, 10*time.Second)}
	ev := taskEvent(t, 1)
	want := taskFrame(ev.Snapshot)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for i, p := range pairs {
		if _, err := p.sink.Write([]hub.Event{ev}); err != nil {
			t.Fatal(err)
		}
		if _, data, err := p.client.Read(ctx); err != nil || string(data) != string(want) {
			t.Fatalf("client %d read %q, %v; want %q", i, data, err, want)
		}
	}
	if !pairs[0].sink.wc.Compressed() || pairs[2].sink.wc.Compressed() {
		t.Fatal("compression was not negotiated as offered")
	}
	ev.Snapshot.Encoded(snapshot.EncodingWebSocketDeflate, func(*snapshot.Snapshot) []byte {
		t.Fatal("the version was not kept compressed")
		return nil
	})
}
