package ws

import (
	"bufio"
	"net"
	"net/http"

	"github.com/pushd/pushd/internal/backlog"
)

// Buffer sizes of a WebSocket connection. net/http hands a hijacked
// connection a 4 KiB reader and a 4 KiB writer, which coder/websocket keeps
// for the connection's life; pushd's messages are a few hundred bytes (a
// client's requests smaller still), and larger ones pass through in pieces.
const (
	readBufferSize  = 512
	writeBufferSize = 1024
)

// smallBuffers gives coder/websocket smaller buffers when it hijacks the
// connection, and puts the sink's backlog writer under its writer, so no
// frame write ever waits for the peer. If the client already sent bytes
// past the handshake, the original reader holding them is kept.
type smallBuffers struct {
	http.ResponseWriter
	sink *sink // its backlog writer is set by Hijack
}

func (s smallBuffers) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	conn, brw, err := http.NewResponseController(s.ResponseWriter).Hijack()
	if err != nil {
		return conn, brw, err
	}
	if brw.Writer.Buffered() > 0 {
		brw.Flush() // net/http wrote nothing of ours; be sure
	}
	backlog.SetSendBuffer(conn, s.sink.sendBuffer)
	s.sink.bw = backlog.New(conn, s.sink.timeout, s.sink.drained)
	r := brw.Reader
	if r.Buffered() == 0 {
		r = bufio.NewReaderSize(conn, readBufferSize)
	}
	return conn, bufio.NewReadWriter(r, bufio.NewWriterSize(s.sink.bw, writeBufferSize)), nil
}
