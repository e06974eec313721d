package wire

import (
	"errors"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/pushd/pushd/internal/testenv"
)

// enteredConn says when a Read of it began.
type enteredConn struct {
	net.Conn
	once    sync.Once
	entered chan struct{}
}

func (c *enteredConn) Read(p []byte) (int, error) {
	c.once.Do(func() { close(c.entered) })
	return c.Conn.Read(p)
}

// Closing the connection ends a read of the library's that waits on a
// silent client, as the close handshake's timeout does: Close takes none of
// the locks that read holds through its wait.
func TestCloseEndsAReadWaitingOnTheSocket(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	client, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	server, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	sock := &enteredConn{Conn: server, entered: make(chan struct{})}
	g := &gate{conn: sock, control: func(byte, []byte) bool { return true }}
	c := gatedConn{Conn: sock, g: g}

	read := make(chan error, 1)
	go func() {
		_, err := c.Read(make([]byte, 16))
		read <- err
	}()
	<-sock.entered // the reader holds the gate and waits on the socket
	closed := make(chan error, 1)
	go func() { closed <- c.Close() }()
	select {
	case err := <-closed:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(testenv.Wait):
		t.Fatal("Close waited for the read it is there to end")
	}
	if err := <-read; !errors.Is(err, net.ErrClosed) {
		t.Fatalf("the read ended with %v, want net.ErrClosed", err)
	}
}
