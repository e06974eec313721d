package node_test

import (
	"bufio"
	"crypto/rand"
	"encoding/base64"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/pushd/pushd/hub"
	"github.com/pushd/pushd/internal/testenv"
)

// rawWS is a WebSocket client written frame by frame, so a test can send
// what no well-behaved library sends: pings as fast as the socket takes
// them, without waiting for their pongs.
type rawWS struct {
	conn net.Conn
	r    *bufio.Reader
}

func dialRawWS(t *testing.T, base, tok string) *rawWS {
	t.Helper()
	u, _ := url.Parse(base)
	conn, err := net.Dial("tcp", u.Host)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	key := make([]byte, 16)
	rand.Read(key)
	fmt.Fprintf(conn, "GET /v1/ws?access_token=%s HTTP/1.1\r\nHost: %s\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"+
		"Sec-WebSocket-Key: %s\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Protocol: pushd.v1\r\n\r\n",
		url.QueryEscape(tok), u.Host, base64.StdEncoding.EncodeToString(key))
	r := bufio.NewReader(conn)
	resp, err := http.ReadResponse(r, nil)
	if err != nil || resp.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("upgrade: %v %v", resp, err)
	}
	return &rawWS{conn: conn, r: r}
}

// frame writes one masked client frame.
func (c *rawWS) frame(opcode byte, payload []byte) error {
	b := []byte{0x80 | opcode, 0x80 | byte(len(payload)), 1, 2, 3, 4}
	for i, p := range payload {
		b = append(b, p^b[2+i%4])
	}
	_, err := c.conn.Write(b)
	return err
}

// closeFrame reads frames until the server's close frame and returns its
// code and reason, counting the pongs before it.
func (c *rawWS) closeFrame(t *testing.T) (code int, reason string, pongs int) {
	t.Helper()
	c.conn.SetReadDeadline(time.Now().Add(waitFor))
	for {
		var h [2]byte
		if _, err := io.ReadFull(c.r, h[:]); err != nil {
			t.Fatalf("no close frame: %v (after %d pongs)", err, pongs)
		}
		n := int(h[1] & 0x7f)
		switch n {
		case 126:
			var l [2]byte
			io.ReadFull(c.r, l[:])
			n = int(binary.BigEndian.Uint16(l[:]))
		case 127:
			var l [8]byte
			io.ReadFull(c.r, l[:])
			n = int(binary.BigEndian.Uint64(l[:]))
		}
		payload := make([]byte, n)
		if _, err := io.ReadFull(c.r, payload); err != nil {
			t.Fatal(err)
		}
		switch h[0] & 0x0f {
		case 0xA:
			pongs++
		case 0x8:
			if n < 2 {
				return 0, "", pongs
			}
			return int(binary.BigEndian.Uint16(payload)), string(payload[2:]), pongs
		}
	}
}

// Four clients flooding the node with pings: each is answered for its
// budget (--ws-control-frames, bursts of twice it), then closed with 1008,
// counted; a neighbour's deliveries go on.
func TestPingFloodClosesTheFlooderOnly(t *testing.T) {
	c := newCluster(t)
	srv := startNode(t, c.config())
	tenant := testenv.UniqueID("t")
	task := testenv.UniqueID("task")
	c.goPublish(t, doc(task, tenant, 1, "RUNNING"))
	tok := token(t, tenant, "u1")
	neighbour := openWS(t, srv.URL, tok)
	neighbour.send(t, map[string]any{"op": "subscribe", "id": 1, "tasks": []string{task}})
	neighbour.nextTask(t)
	neighbour.NextOf(t, "ack")

	const flooders = 4
	var wg sync.WaitGroup
	type result struct {
		code, pongs int
		reason      string
	}
	results := make(chan result, flooders)
	for range flooders {
		fl := dialRawWS(t, srv.URL, tok)
		wg.Add(1)
		go func() { // writes pings until the node closes the socket
			defer wg.Done()
			for fl.frame(0x9, []byte("flood")) == nil {
			}
		}()
		code, reason, pongs := fl.closeFrame(t)
		fl.conn.Close()
		results <- result{code, pongs, reason}
	}
	wg.Wait()
	close(results)
	for r := range results {
		// The burst is 10 at the default of 5 a second, and the flood takes
		// well under a second; a slow machine may refill a few.
		if r.code != 1008 || r.reason != "control frames too fast" || r.pongs < 10 || r.pongs > 20 {
			t.Fatalf("a flooder got %d pongs, then close %d %q; want about 10, then 1008 control frames too fast", r.pongs, r.code, r.reason)
		}
	}
	c.goPublish(t, doc(task, tenant, 2, "RUNNING"))
	if s := neighbour.nextTask(t); s.Version != 2 {
		t.Fatalf("the neighbour got v%d, want v2", s.Version)
	}
	testenv.Eventually(t, "the flooders counted", func() bool {
		return testenv.Scrape(t, srv.AdminURL)[`pushd_disconnects_total{reason="control_flood"}`] == flooders
	})
	if st := srv.Hub().Stats(); st.Cuts[hub.CutFlooded] != flooders {
		t.Fatalf("%d connections closed for flooding, want %d", st.Cuts[hub.CutFlooded], flooders)
	}
}
