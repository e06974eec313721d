package backlog_test

import (
	"bytes"
	"errors"
	"io"
	"net"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/pushd/pushd/internal/backlog"
)

// pair is a server end with a Writer over it and a client end with a small
// receive buffer, over real loopback TCP.
func pair(t *testing.T, timeout time.Duration) (*backlog.Writer, net.Conn, chan error) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	d := net.Dialer{Control: func(_, _ string, rc syscall.RawConn) error {
		return rc.Control(func(fd uintptr) { syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096) })
	}}
	client, err := d.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	server, err := l.Accept()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close(); server.Close() })
	drained := make(chan error, 4)
	return backlog.New(server, timeout, func(err error) { drained <- err }), client, drained
}

// fill writes chunks until the socket takes no more at once and the Writer
// keeps the rest; it returns everything written, in order.
func fill(t *testing.T, w *backlog.Writer) []byte {
	t.Helper()
	chunk := bytes.Repeat([]byte("0123456789abcdef"), 4096) // 64 KiB
	var all []byte
	for i := 0; w.Backlog() == 0; i++ {
		if i == 1000 {
			t.Fatal("64 MiB written to a client that reads nothing, and nothing kept")
		}
		chunk[0] = byte(i)
		if n, err := w.Write(chunk); n != len(chunk) || err != nil {
			t.Fatalf("write %d: %d, %v", i, n, err)
		}
		all = append(all, chunk...)
	}
	return all
}

func TestBacklogIsWrittenOnceTheClientReads(t *testing.T) {
	defer goleak.VerifyNone(t)
	w, client, drained := pair(t, 10*time.Second)
	want := fill(t, w)
	tail := []byte("and the tail, written while draining")
	if n, err := w.Write(tail); n != len(tail) || err != nil {
		t.Fatalf("write while draining: %d, %v", n, err)
	}
	want = append(want, tail...)
	if !w.NotifyWhenDrained() {
		t.Fatal("nothing waits to be written after a backlog formed")
	}
	got := make([]byte, len(want))
	if _, err := io.ReadFull(client, got); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatal("the client read other bytes, or in another order, than were written")
	}
	select {
	case err := <-drained:
		if err != nil {
			t.Fatalf("drained with %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("drained not called after the client read everything")
	}
	if w.Backlog() != 0 || w.NotifyWhenDrained() {
		t.Fatal("a backlog remains after it was written")
	}
	// Back to writing directly: a small write is not kept.
	if _, err := w.Write([]byte("x")); err != nil || w.Backlog() != 0 {
		t.Fatalf("write after draining: %v, backlog %d", err, w.Backlog())
	}
}

func TestBacklogNotWrittenWithinTheTimeoutFailsTheWriter(t *testing.T) {
	defer goleak.VerifyNone(t)
	w, _, drained := pair(t, 200*time.Millisecond)
	fill(t, w)
	// More than the kernel lets a socket's send buffer grow to (4 MiB by
	// default), so the backlog cannot drain into it.
	more := make([]byte, 16<<20)
	if _, err := w.Write(more); err != nil {
		t.Fatal(err)
	}
	w.NotifyWhenDrained()
	select {
	case err := <-drained:
		if !errors.Is(err, net.ErrClosed) && !errors.Is(err, syscall.EPIPE) && !isTimeout(err) {
			t.Fatalf("drained with %v, want a timeout", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a backlog nobody read outlived its write timeout")
	}
	if _, err := w.Write([]byte("x")); err == nil {
		t.Fatal("a write after the backlog failed succeeded")
	}
}

func TestBacklogEndsWhenTheSocketCloses(t *testing.T) {
	defer goleak.VerifyNone(t)
	w, client, drained := pair(t, time.Hour)
	fill(t, w)
	w.Write(make([]byte, 16<<20))
	client.Close() // the peer resets: the drain goroutine's write fails
	select {
	case err := <-drained:
		if err == nil {
			t.Fatal("drained without error after the peer went away")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the drain goroutine outlived its peer")
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}
