package node_test

import (
	"context"
	"net"
	"net/http"
	"net/url"
	"sync/atomic"
	"testing"

	"github.com/coder/websocket"

	"github.com/pushd/pushd/internal/testenv"
	"github.com/pushd/pushd/node"
)

// countingClient is an HTTP client whose connections count every byte
// they read from the server: what a client pays on the wire, framing,
// ids and HTTP's own bytes included (TCP/IP headers not).
func countingClient() (*http.Client, *atomic.Int64) {
	read := new(atomic.Int64)
	var d net.Dialer
	tr := &http.Transport{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := d.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return countingConn{c, read}, nil
	}}
	return &http.Client{Transport: tr}, read
}

type countingConn struct {
	net.Conn
	read *atomic.Int64
}

func (c countingConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.read.Add(int64(n))
	return n, err
}

// TestWireBytesPerEventKind measures the bytes a client reads for each
// kind of event, over SSE (as pushd.js asks: cursor=own) and WebSocket
// (with and without compression), with and without deltas: a queued
// task's first event, a progress tick (progress, version and updated_at
// change) and the task finished with its output. With deltas, a tick
// costs at most half its whole event; compressed, a whole event costs at
// most four fifths, and a patch no more than uncompressed.
// docs/BENCHMARKS.md holds the figures (go test ./node -run
// TestWireBytesPerEventKind -v).
func TestWireBytesPerEventKind(t *testing.T) {
	cfg := node.Config{JWTSecret: testSecret}
	cfg.WS.Compression = true
	s := startNode(t, cfg)
	tok := token(t, "t1", "u1")
	type variant struct{ deltas, deflate bool }
	type reader struct {
		name string
		read *atomic.Int64
		next func() // reads the next task or patch event
	}
	open := func(t *testing.T, task, transport string, v variant) reader {
		client, read := countingClient()
		name := transport
		if v.deflate {
			name += ", deflate"
		}
		if v.deltas {
			name += ", deltas"
		}
		if transport == "sse" {
			q := "task=" + task + "&cursor=own"
			if v.deltas {
				q += "&deltas=merge"
			}
			c := &sseClient{testenv.OpenSSE(t, client, s.URL+"/v1/events?"+q, "Authorization", "Bearer "+tok)}
			var cursor string
			return reader{name, read, func() { nextSSETaskOrPatch(t, c, &cursor) }}
		}
		q := url.Values{}
		if v.deltas {
			q.Set("deltas", "merge")
		}
		opts := &websocket.DialOptions{Subprotocols: []string{"pushd.v1"}, HTTPClient: client}
		if v.deflate {
			opts.CompressionMode = websocket.CompressionNoContextTakeover
		}
		c, _, err := dialWSQuery(t, s.URL, tok, q, opts)
		if err != nil {
			t.Fatal(err)
		}
		c.send(t, map[string]any{"op": "subscribe", "id": 1, "tasks": []string{task}})
		return reader{name, read, func() {
			for {
				switch m := c.Next(t); msgType(m) {
				case "task", "patch":
					return
				case "ack":
				default:
					t.Fatalf("unexpected message %s", rawString(m))
				}
			}
		}}
	}
	// bytes reads r's next event and returns what the client read for it
	// since the last: one event at a time, so nothing else is counted.
	bytes := func(r reader, before *int64) int64 {
		r.next()
		n := r.read.Load()
		defer func() { *before = n }()
		return n - *before
	}
	whole, deltas := variant{}, variant{deltas: true}
	deflate, deflateDeltas := variant{deflate: true}, variant{deflate: true, deltas: true}
	for _, tc := range []struct {
		transport string
		variants  []variant
	}{
		{"sse", []variant{whole, deltas}},
		{"ws", []variant{whole, deltas, deflate, deflateDeltas}},
	} {
		task := testenv.UniqueID("task")
		httpPublish(t, s.URL, doc(task, "t1", 1, "QUEUED"))
		readers := make([]reader, len(tc.variants))
		before := make([]int64, len(readers))
		for i, v := range tc.variants {
			readers[i] = open(t, task, tc.transport, v)
			readers[i].next() // the subscription's first event, after the handshake
			before[i] = readers[i].read.Load()
		}
		ticks := map[variant]int64{}
		for v := int64(2); v <= 5; v++ {
			httpPublish(t, s.URL, tick(task, "t1", v))
			for i, r := range readers {
				ticks[tc.variants[i]] = bytes(r, &before[i]) // the last tick's
			}
		}
		finish := finished(task, "t1", 6)
		httpPublish(t, s.URL, finish)
		finished := map[variant]int64{}
		for i, r := range readers {
			n := bytes(r, &before[i])
			finished[tc.variants[i]] = n
			t.Logf("%-20s progress tick %4d B (document %d B), finished with output %4d B (document %d B)",
				r.name, ticks[tc.variants[i]], len(tick(task, "t1", 5)), n, len(finish))
		}
		if 2*ticks[deltas] > ticks[whole] {
			t.Errorf("%s: a progress tick costs %d bytes with deltas, %d whole: want at most half", tc.transport, ticks[deltas], ticks[whole])
		}
		if tc.transport != "ws" {
			continue
		}
		for _, f := range []map[variant]int64{ticks, finished} {
			if 5*f[deflate] > 4*f[whole] {
				t.Errorf("a whole event costs %d bytes compressed, %d not: want at most four fifths", f[deflate], f[whole])
			}
		}
		if ticks[deflateDeltas] > ticks[deltas] {
			t.Errorf("a patch costs %d bytes compressed, %d not", ticks[deflateDeltas], ticks[deltas])
		}
	}
}
