package sse_test

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pushd/pushd/fanout"
	"github.com/pushd/pushd/hub"
	"github.com/pushd/pushd/internal/testenv"
	"github.com/pushd/pushd/snapshot"
	"github.com/pushd/pushd/sse"
)

// TestStalledStreamHoldsNoWriter: with a hub of one writer, a stream whose
// client stopped reading must not hold it, on either path: taken over
// (HTTP/1.1) or kept in its handler goroutine (HTTP/2, here NoHijack). A
// healthy stream beside it gets every change while the stalled one is
// still open, and the stalled one is cut once its backlog outlives the
// write timeout.
func TestStalledStreamHoldsNoWriter(t *testing.T) {
	for _, noHijack := range []bool{false, true} {
		t.Run(fmt.Sprintf("NoHijack=%v", noHijack), func(t *testing.T) {
			store := snapshot.NewMemoryStore()
			bus := fanout.NewMemoryBus()
			h := hub.New(hub.Config{Source: store, Bus: bus, Writers: 1, WriteTimeout: 8 * time.Second})
			bus.Start(h)
			s := sse.New(sse.Config{Hub: h, NoHijack: noHijack, CheckInterval: 50 * time.Millisecond})
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
			publish := func(task string, v int64, pad int) {
				sn, err := snapshot.Parse(fmt.Appendf(nil, `{"task_id":%q,"tenant_id":"t1","status":"RUNNING","version":%d,"pad":%q}`,
					task, v, strings.Repeat("x", pad)))
				if err != nil {
					t.Fatal(err)
				}
				store.SetIfNewer(context.Background(), sn)
				h.Notify(snapshot.Notification{TenantID: "t1", TaskID: task, Version: v})
			}
			publish("task_small", 1, 0)
			for i := range 10 {
				publish(fmt.Sprintf("task_big%d", i), 1, 0)
			}

			stalled := dial(t, srv.URL, true)
			fmt.Fprintf(stalled, "GET /?task=task_small&task=task_big0&task=task_big1&task=task_big2&task=task_big3&task=task_big4&task=task_big5&task=task_big6&task=task_big7&task=task_big8&task=task_big9 HTTP/1.1\r\nHost: x\r\n\r\n")
			healthy := dial(t, srv.URL, false)
			fmt.Fprintf(healthy, "GET /?task=task_small HTTP/1.1\r\nHost: x\r\n\r\n")
			br := bufio.NewReader(healthy)
			waitVersion(t, br, 1)
			testenv.Eventually(t, "the stalled stream registered", func() bool { return h.Len() == 2 })

			// 7 MB for the stalled client, past what loopback buffers take
			// (about 3 MB), in far less time than the write timeout.
			const rounds = 12
			for v := int64(2); v <= rounds; v++ {
				for i := range 10 {
					publish(fmt.Sprintf("task_big%d", i), v, 60<<10)
				}
				publish("task_small", v, 0)
				waitVersion(t, br, v)
			}
			st := h.Stats()
			if n, we := h.Len(), st.Cuts[hub.CutWriteFailed]; n != 2 || we != 0 {
				t.Fatalf("when the healthy stream had every change: %d streams, %d write errors; the stalled one was cut first, so the healthy one waited for it", n, we)
			}
			if st.Backlogged == 0 {
				t.Fatal("no write was queued behind the stalled stream: it did not stall, so the test proves nothing")
			}
			testenv.EventuallyWithin(t, "the stalled stream cut after its write timeout", 30*time.Second, func() bool { return h.Len() == 1 })
		})
	}
}

func dial(t *testing.T, base string, small bool) net.Conn {
	t.Helper()
	d := net.Dialer{}
	if small {
		d.Control = func(_, _ string, rc syscall.RawConn) error {
			return rc.Control(func(fd uintptr) { syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096) })
		}
	}
	conn, err := d.Dial("tcp", strings.TrimPrefix(base, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// waitVersion reads the healthy stream until task_small's version v.
func waitVersion(t *testing.T, br *bufio.Reader, v int64) {
	t.Helper()
	want := fmt.Sprintf(`"version":%d,`, v)
	done := make(chan error, 1)
	go func() {
		for {
			line, err := br.ReadString('\n')
			if err != nil {
				done <- err
				return
			}
			if strings.HasPrefix(line, "data: ") && strings.Contains(line, want) {
				done <- nil
				return
			}
		}
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("healthy stream: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("healthy stream: no version %d within 10s", v)
	}
}
