package ws

import (
	"bufio"
	"net"
	"net/http"
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
// connection, and keeps the connection so the sink can set write deadlines
// on it. If the client already sent bytes past the handshake, the original
// reader holding them is kept.
type smallBuffers struct {
	http.ResponseWriter
	conn *net.Conn // set by Hijack
}

func (s smallBuffers) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	conn, brw, err := http.NewResponseController(s.ResponseWriter).Hijack()
	*s.conn = conn
	if err != nil || brw.Reader.Buffered() > 0 || brw.Writer.Buffered() > 0 {
		return conn, brw, err
	}
	return conn, bufio.NewReadWriter(bufio.NewReaderSize(conn, readBufferSize), bufio.NewWriterSize(conn, writeBufferSize)), nil
}
