//go:build !race

// The race detector changes what allocates and how big objects are, so
// memory guards run without it: scripts/test runs them in a step of their
// own.

package sse_test

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/pushd/pushd/fanout"
	"github.com/pushd/pushd/hub"
	"github.com/pushd/pushd/internal/testenv"
	"github.com/pushd/pushd/snapshot"
	"github.com/pushd/pushd/sse"
)

// maxIdleBytesPerConn bounds what an idle taken-over stream keeps live:
// the hub's Conn with what it watches and delivered, the index entry of its
// task, the sink, its backlog writer and encoder, the reaper's entry, and
// both ends of the TCP connection (the client's is in this process too).
// With a browser's token in the URL, it measured 2,900 bytes before the
// hub's sets became slices, the index kept a task's only watcher inline
// and the Conn's flags were grouped; 2,270 after; 1,830 once the ids
// stopped keeping the request line (and its token) alive; about 1,920
// once the index kept a note of the last hint and read of each task
// watched by id (the delivery inspector's).
const maxIdleBytesPerConn = 2100

// TestIdleStreamMemory opens conns real streams, each watching a task of
// its own as the idle load test's do, waits until each has its snapshot,
// and bounds the live heap they added per connection. With IDLEMEM_PROF
// set to a file name, it writes a heap profile there at the measurement
// (run it with -memprofilerate=1 for every allocation).
func TestIdleStreamMemory(t *testing.T) {
	const conns = 2000
	store := snapshot.NewMemoryStore()
	bus := fanout.NewMemoryBus()
	h := hub.New(hub.Config{Source: store, Bus: bus})
	bus.Start(h)
	s := sse.New(sse.Config{Hub: h})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.Serve(w, r, hub.Principal{TenantID: "t1", UserID: "u1", Grant: &snapshot.Grant{All: true}})
	}))
	t.Cleanup(func() {
		srv.CloseClientConnections()
		h.Close()
		s.Close()
		bus.Close()
		srv.Close()
	})
	for i := range conns + 1 {
		sn, err := snapshot.Parse(fmt.Appendf(nil, `{"task_id":"task_%d","tenant_id":"t1","user_id":"u1","status":"RUNNING","version":1}`, i))
		if err != nil {
			t.Fatal(err)
		}
		store.SetIfNewer(context.Background(), sn)
	}
	addr := strings.TrimPrefix(srv.URL, "http://")
	token := strings.Repeat("t", 400) // about a JWT's length
	open := func(i int) net.Conn {
		t.Helper()
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		// A browser's EventSource sends its token in the URL.
		fmt.Fprintf(c, "GET /v1/events?task=task_%d&access_token=%s HTTP/1.1\r\nHost: x\r\n\r\n", i, token)
		c.SetReadDeadline(time.Now().Add(10 * time.Second))
		br := bufio.NewReaderSize(c, 256)
		for {
			line, err := br.ReadString('\n')
			if err != nil {
				t.Fatalf("stream %d: %v", i, err)
			}
			if line == "event: task\n" {
				break
			}
		}
		return c
	}
	per := testenv.LiveBytesPerConn(t, conns, open, func() bool { return h.Len() == conns+1 })
	t.Logf("%d bytes live per idle stream", per)
	if per > maxIdleBytesPerConn {
		t.Fatalf("an idle stream keeps %d bytes live, want at most %d", per, maxIdleBytesPerConn)
	}
}
