package node_test

import (
	"bufio"
	"fmt"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/pushd/pushd/testenv"
)

func TestSlowReaderDoesNotDelayOthers(t *testing.T) {
	c := newCluster(t)
	cfg := c.config()
	cfg.WriteTimeout = 3 * time.Second
	s := startNode(t, cfg)
	const tasks, rounds = 40, 8
	ids := make([]string, tasks)
	query := make([]string, tasks)
	for i := range ids {
		ids[i] = testenv.UniqueID("task")
		query[i] = "task=" + ids[i]
		c.goPublish(t, doc(ids[i], "t1", 1, "RUNNING"))
	}
	tok := token(t, "t1", "u1")

	// A client that reads its headers and hello, then never reads again.
	conn, err := net.Dial("tcp", strings.TrimPrefix(s.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprintf(conn, "GET /v1/events?%s HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\n\r\n", strings.Join(query, "&"), tok)
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("slow client: %v %v", resp, err)
	}
	good := openSSE(t, s.URL, tok, strings.Join(query, "&"))
	for range tasks {
		good.nextTask(t)
	}
	if n := s.Hub().Len(); n != 2 {
		t.Fatalf("%d connections, want 2", n)
	}

	// Far more than socket buffers hold: the slow client's writer blocks.
	pad := strings.Repeat("x", 60<<10)
	for v := int64(2); v <= rounds+1; v++ {
		for _, id := range ids {
			c.goPublish(t, strings.Replace(doc(id, "t1", v, "RUNNING"), `"x_custom"`, `"pad":"`+pad+`","x_custom"`, 1))
		}
	}
	latest := make(map[string]int64)
	for done := 0; done < tasks; {
		snap := good.nextTask(t)
		if snap.Version == rounds+1 && latest[snap.TaskID] != rounds+1 {
			done++
		}
		latest[snap.TaskID] = snap.Version
	}
	// Everything reached the good client while the slow one was still
	// connected: nobody waited for its write timeout.
	st := s.Hub().Stats()
	if n, we := s.Hub().Len(), st.WriteErrors.Load(); n != 2 || we != 0 {
		t.Fatalf("after the good client caught up: %d connections, %d write errors; the slow client was cut before, so the test proves nothing", n, we)
	}
	if st.Conflated.Load() == 0 {
		t.Fatal("nothing conflated: the slow client's outbox did not bound what it holds")
	}
	// And the slow client is disconnected and counted once its write times out.
	deadline := time.Now().Add(waitFor)
	for s.Hub().Len() != 1 || st.WriteErrors.Load() == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("slow client not disconnected: %d connections, %d write errors", s.Hub().Len(), st.WriteErrors.Load())
		}
		time.Sleep(20 * time.Millisecond) // polling the hub while the write deadline runs out
	}
}
