package ws

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"sync"

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
	s.sink.out.w = s.sink.bw
	r := brw.Reader
	if r.Buffered() == 0 {
		r = bufio.NewReaderSize(conn, readBufferSize)
	}
	return conn, bufio.NewReadWriter(r, bufio.NewWriterSize(&s.sink.out, writeBufferSize)), nil
}

// batcher sits between coder/websocket's buffered writer and the backlog
// writer. coder/websocket flushes after every frame, so a Write of several
// events would cost a write(2) each; while a batch is open the flushes are
// collected and go out in one write when it closes. Frames the library
// writes meanwhile from other goroutines (pongs, pings, a close) join the
// batch in the order they were flushed: each flush is whole frames, as
// the library serializes its frame writes.
type batcher struct {
	mu    sync.Mutex
	w     io.Writer // the backlog writer
	batch *[]byte   // non-nil while a batch is open
}

// batchBuffers hold the frames of open batches: an idle connection keeps
// none.
var batchBuffers = sync.Pool{New: func() any { b := make([]byte, 0, 4<<10); return &b }}

// maxPooledBatch is the largest batch buffer kept for reuse; a larger one
// (a subscription's initial state) is left to the collector.
const maxPooledBatch = 256 << 10

func (b *batcher) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.batch != nil {
		*b.batch = append(*b.batch, p...)
		return len(p), nil
	}
	return b.w.Write(p)
}

// open starts collecting flushes.
func (b *batcher) open() {
	buf := batchBuffers.Get().(*[]byte)
	b.mu.Lock()
	b.batch = buf
	b.mu.Unlock()
}

// close writes what the open batch collected, in one write, and ends it.
func (b *batcher) close() error {
	b.mu.Lock()
	buf := b.batch
	b.batch = nil
	var err error
	if len(*buf) > 0 {
		_, err = b.w.Write(*buf) // the backlog writer copies what it keeps
	}
	b.mu.Unlock()
	if cap(*buf) <= maxPooledBatch {
		*buf = (*buf)[:0]
		batchBuffers.Put(buf)
	}
	return err
}
