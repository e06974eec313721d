package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
)

// TestCentrifugoConfig checks the configuration a Centrifugo run starts
// with: the Redis engine on the run's Redis, the run's token secret and API
// key, uni_sse on, the task namespace without history, /metrics and /health
// served, everything on loopback.
func TestCentrifugoConfig(t *testing.T) {
	b, err := centrifugoConfig(4321, "redis://127.0.0.1:6390/0", "tok-secret", "api-key")
	if err != nil {
		t.Fatal(err)
	}
	var cfg struct {
		HTTPServer struct {
			Address string `json:"address"`
			Port    int    `json:"port"`
		} `json:"http_server"`
		Engine struct {
			Type  string `json:"type"`
			Redis struct {
				Address []string `json:"address"`
			} `json:"redis"`
		} `json:"engine"`
		Client struct {
			Token struct {
				HMACSecretKey string `json:"hmac_secret_key"`
			} `json:"token"`
		} `json:"client"`
		HTTPAPI struct {
			Key string `json:"key"`
		} `json:"http_api"`
		UniSSE     struct{ Enabled bool }  `json:"uni_sse"`
		Prometheus struct{ Enabled bool }  `json:"prometheus"`
		Health     struct{ Enabled bool }  `json:"health"`
		UsageStats struct{ Disabled bool } `json:"usage_stats"`
		Channel    struct {
			Namespaces []map[string]any `json:"namespaces"`
		} `json:"channel"`
	}
	if err := json.Unmarshal(b, &cfg); err != nil {
		t.Fatalf("%v in\n%s", err, b)
	}
	if cfg.HTTPServer.Address != "127.0.0.1" || cfg.HTTPServer.Port != 4321 {
		t.Errorf("http_server %+v", cfg.HTTPServer)
	}
	if cfg.Engine.Type != "redis" || len(cfg.Engine.Redis.Address) != 1 || cfg.Engine.Redis.Address[0] != "redis://127.0.0.1:6390/0" {
		t.Errorf("engine %+v", cfg.Engine)
	}
	if cfg.Client.Token.HMACSecretKey != "tok-secret" || cfg.HTTPAPI.Key != "api-key" {
		t.Errorf("token secret %q, API key %q", cfg.Client.Token.HMACSecretKey, cfg.HTTPAPI.Key)
	}
	if !cfg.UniSSE.Enabled || !cfg.Prometheus.Enabled || !cfg.Health.Enabled || !cfg.UsageStats.Disabled {
		t.Errorf("uni_sse %v, prometheus %v, health %v, usage stats disabled %v", cfg.UniSSE.Enabled, cfg.Prometheus.Enabled, cfg.Health.Enabled, cfg.UsageStats.Disabled)
	}
	ns := cfg.Channel.Namespaces
	if len(ns) != 1 || ns[0]["name"] != "task" || ns[0]["history_size"] != 0.0 || len(ns[0]) != 2 {
		t.Errorf("namespaces %v, want task alone, without history", ns)
	}
	if centrifugoChannel(7) != "task:lt_7" {
		t.Errorf("channel %q", centrifugoChannel(7))
	}
}

// testWorker is a worker with what a client's parsing needs.
func testWorker(centrifugo bool) *worker {
	w := &worker{errs: map[string]int64{}, modeSeen: map[string]*modeSeen{}, centrifugo: centrifugo, dialers: []*net.Dialer{{}}}
	w.setPhase("p")
	return w
}

func (w *worker) deliveriesForTest() int64 {
	var n int64
	for i := range w.phase.Load().shards {
		n += w.phase.Load().shards[i].deliveries
	}
	return n
}

// TestReadCentrifugoSSE parses a uni_sse stream as Centrifugo writes it
// (the blank line it opens with, the connect push with its subscription,
// publications, a disconnect push): the connect push's "version" is the
// server's and not a task's, and a version that goes backwards is caught
// though Centrifugo knows nothing of versions.
func TestReadCentrifugoSSE(t *testing.T) {
	w := testWorker(true)
	c := &conn{w: w, task: 1}
	stream := "\r\n" +
		`data: {"connect":{"client":"8c03409e-7afd-4711-b1a8-513d500ca7da","version":"0.0.0 OSS","subs":{"task:lt_1":{}},"expires":true,"ttl":3600,"ping":25,"session":"97d9e453-c096-48ca-94e1-8ea07ea6a4ae"}}` + "\n\n" +
		`data: {"channel":"task:lt_1","pub":{"data":{"version":1,"sent_ns":5}}}` + "\n\n" +
		`data: {"channel":"task:lt_1","pub":{"data":{"task_id":"lt_1","version":2,"sent_ns":5}}}` + "\n\n" +
		"data: {}\n\n" + // a ping
		`data: {"channel":"task:lt_1","pub":{"data":{"task_id":"lt_1","version":1,"sent_ns":5}}}` + "\n\n" +
		`data: {"disconnect":{"code":3001,"reason":"shutdown"}}` + "\n\n"
	err := c.readSSE(bufio.NewReaderSize(strings.NewReader(stream), 4096))
	if !errors.Is(err, io.EOF) {
		t.Fatalf("readSSE: %v, want EOF", err)
	}
	if got := c.last.Load(); got != 2 {
		t.Errorf("last version %d, want 2", got)
	}
	if n := w.regressions.Load(); n != 1 {
		t.Errorf("%d regressions, want 1 (version 1 after 2)", n)
	}
	if n := w.deliveriesForTest(); n != 3 {
		t.Errorf("%d deliveries, want 3", n)
	}
	if w.errs["centrifugo_disconnect_3001"] != 1 || w.errs["malformed_task"] != 0 || len(w.errs) != 1 {
		t.Errorf("client counts %v, want one disconnect", w.errs)
	}
	// pushd's own events are not Centrifugo's pushes.
	w = testWorker(false)
	c = &conn{w: w, task: 1}
	c.readSSE(bufio.NewReader(strings.NewReader(`data: {"channel":"task:lt_1","pub":{"data":{"version":1,"sent_ns":5}}}` + "\n\n")))
	if c.last.Load() != 0 {
		t.Error("a pushd client read an unnamed event as a task")
	}
}

// TestCentrifugoSSERequest checks the uni_sse request carries the token in
// the connect request, URL-encoded.
func TestCentrifugoSSERequest(t *testing.T) {
	c := &conn{w: testWorker(true), token: "a.b-c"}
	req := string(c.sseRequest(nil, "127.0.0.1:9"))
	want := "GET /connection/uni_sse?cf_connect=%7B%22token%22%3A%22a.b-c%22%7D HTTP/1.1\r\nHost: 127.0.0.1:9\r\n"
	if !strings.HasPrefix(req, want) || !strings.HasSuffix(req, "\r\n\r\n") {
		t.Errorf("request %q, want it to start %q", req, want)
	}
}

// centrifugoWSServer plays Centrifugo's side of the bidirectional JSON
// protocol with frames recorded from Centrifugo: the connect reply, two
// publications joined in one frame, a ping whose pong it waits for, a third
// publication, then a close. A token other than "good" gets the close
// Centrifugo sends for an invalid one.
func centrifugoWSServer(t *testing.T, ponged chan<- bool) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/connection/websocket" {
			http.NotFound(rw, r)
			return
		}
		wc, err := websocket.Accept(rw, r, nil)
		if err != nil {
			return
		}
		defer wc.CloseNow()
		ctx, cancel := context.WithTimeout(r.Context(), 10*time.Second)
		defer cancel()
		_, cmd, err := wc.Read(ctx)
		if err != nil {
			return
		}
		if string(cmd) != `{"id":1,"connect":{"token":"good","name":"loadtest"}}` {
			wc.Close(3500, "invalid token")
			return
		}
		pub := func(v string) string {
			return `{"push":{"channel":"task:lt_3","pub":{"data":{"task_id":"lt_3","version":` + v + `,"sent_ns":1}}}}`
		}
		for _, frame := range []string{
			`{"id":1,"connect":{"client":"94d8f2d9-5eed-4e47-907c-728b94055513","version":"0.0.0 OSS","expires":true,"ttl":3600,"subs":{"task:lt_3":{}},"ping":25,"pong":true}}`,
			pub("1") + "\n" + pub("2"),
			`{}`,
		} {
			if wc.Write(ctx, websocket.MessageText, []byte(frame)) != nil {
				return
			}
		}
		_, pong, err := wc.Read(ctx)
		ponged <- err == nil && string(pong) == "{}"
		wc.Write(ctx, websocket.MessageText, []byte(pub("3")))
		wc.Close(websocket.StatusNormalClosure, "")
	}))
	t.Cleanup(srv.Close)
	return srv
}

func TestCentrifugoWS(t *testing.T) {
	ponged := make(chan bool, 1)
	srv := centrifugoWSServer(t, ponged)
	w := testWorker(true)
	w.urls = []string{srv.URL}

	c := &conn{w: w, task: 3, token: "good"}
	opened := 0
	c.first = func(error) { opened++ }
	established, err := runSession(c.sessionWS)
	if !established || websocket.CloseStatus(err) != websocket.StatusNormalClosure {
		t.Fatalf("session: established %v, %v; want established and a normal close", established, err)
	}
	if opened != 1 {
		t.Errorf("opened %d times, want once, at the connect reply", opened)
	}
	if !<-ponged {
		t.Error("the ping got no pong")
	}
	if got, n := c.last.Load(), w.deliveriesForTest(); got != 3 || n != 3 {
		t.Errorf("last version %d after %d deliveries, want 3 and 3", got, n)
	}
	if w.regressions.Load() != 0 || len(w.errs) != 0 {
		t.Errorf("regressions %d, client counts %v", w.regressions.Load(), w.errs)
	}

	c = &conn{w: w, task: 3, token: "bad"}
	established, err = runSession(c.sessionWS)
	if established || errKind(err, established) != "centrifugo_error_3500" {
		t.Errorf("refused connect: established %v, %v (%s), want centrifugo_error_3500", established, err, errKind(err, established))
	}
}

// TestCentrifugoAPI publishes through the HTTP API as the publisher does
// and reports an error reply, which Centrifugo sends with status 200.
func TestCentrifugoAPI(t *testing.T) {
	var got []string
	srv := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		got = append(got, r.Method+" "+r.URL.Path+" "+r.Header.Get("X-API-Key")+" "+string(b))
		if strings.Contains(string(b), "lt_9") {
			io.WriteString(rw, `{"error":{"code":102,"message":"unknown channel"}}`)
			return
		}
		io.WriteString(rw, `{"result":{}}`)
	}))
	defer srv.Close()
	api := newCentrifugoAPI(srv.URL, "k", 2)
	defer api.client.CloseIdleConnections()
	ctx := context.Background()
	if written, err := api.store(ctx, 4, []byte(`{"version":2}`)); !written || err != nil {
		t.Errorf("store: %v, %v", written, err)
	}
	if _, err := api.store(ctx, 9, []byte(`{"version":1}`)); err == nil || !strings.Contains(err.Error(), "unknown channel") {
		t.Errorf("error reply: %v", err)
	}
	if len(got) != 2 || got[0] != `POST /api/publish k {"channel":"task:lt_4","data":{"version":2}}` {
		t.Errorf("requests %q", got)
	}
}

// TestCentrifugoDeliveries adds up the publications of every transport
// from a scrape of Centrifugo's /metrics.
func TestCentrifugoDeliveries(t *testing.T) {
	m := parseMetrics(strings.NewReader(`centrifugo_node_num_clients 2
centrifugo_transport_messages_sent{channel_namespace="",frame_type="push_connect",transport="uni_sse"} 1
centrifugo_transport_messages_sent{channel_namespace="",frame_type="push_publication",transport="uni_sse"} 5
centrifugo_transport_messages_sent{channel_namespace="",frame_type="push_publication",transport="websocket"} 7
centrifugo_transport_messages_sent_size{channel_namespace="",frame_type="push_publication",transport="uni_sse"} 64
`))
	if d := centrifugoDeliveries(m); d != 12 {
		t.Errorf("deliveries %v, want 12", d)
	}
	if n := m[serverKinds["centrifugo"].connections]; n != 2 {
		t.Errorf("connections %v", n)
	}
}

// TestOwnSeries keeps what the JSON result can hold: a summary quantile
// with no observations is NaN in Centrifugo's /metrics.
func TestOwnSeries(t *testing.T) {
	m := parseMetrics(strings.NewReader(`centrifugo_node_num_clients 2
centrifugo_client_command_duration_seconds{channel_namespace="",method="connect",quantile="0.5"} NaN
centrifugo_node_broadcast_duration_seconds_bucket{channel_namespace="",type="publication",le="+Inf"} 1
go_goroutines 99
`))
	own := ownSeries(m, "centrifugo_")
	if len(own) != 1 || own["centrifugo_node_num_clients"] != 2 {
		t.Errorf("own series %v", own)
	}
	if _, err := json.Marshal(own); err != nil {
		t.Error(err)
	}
}

// TestTargetFlags: -target centrifugo runs only fanout and idle, on one
// node, needs a binary, and -target both runs pushd, then Centrifugo
// without PostgreSQL.
func TestTargetFlags(t *testing.T) {
	for _, args := range [][]string{
		{"-scenario", "churn", "-target", "both", "-centrifugo-bin", "/bin/true"},
		{"-quick", "-target", "centrifugo", "-centrifugo-bin", "/bin/true"},
		{"-scenario", "fanout", "-target", "centrifugo"},
		{"-scenario", "fanout", "-target", "nats"},
		{"-cluster", "-scenario", "fanout", "-target", "both", "-centrifugo-bin", "/bin/true"},
	} {
		if _, err := parseFlags(args, io.Discard); err == nil {
			t.Errorf("%v: accepted", args)
		}
	}
	cfg, err := parseFlags([]string{"-scenario", "fanout", "-transport", "ws", "-target", "both", "-centrifugo-bin", "/bin/true"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	runs := cfg.runs()
	if len(runs) != 2 || runs[0].Target != "pushd" || runs[1].Target != "centrifugo" {
		t.Fatalf("runs %+v", runs)
	}
	// Side by side, neither publisher writes rows unless asked: the load
	// generator's core then carries the same work beside both servers.
	if runs[0].PGWrites != "off" || runs[1].PGWrites != "off" || runs[1].Transport != "ws" || runs[1].Conns != runs[0].Conns {
		t.Errorf("pushd: pg %s; centrifugo: pg %s, transport %s, conns %d vs %d", runs[0].PGWrites, runs[1].PGWrites, runs[1].Transport, runs[1].Conns, runs[0].Conns)
	}
	cfg, err = parseFlags([]string{"-scenario", "fanout", "-target", "both", "-pg-writes", "always", "-centrifugo-bin", "/bin/true"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if runs := cfg.runs(); runs[0].PGWrites != "always" || runs[1].PGWrites != "off" {
		t.Errorf("-pg-writes always side by side: pushd %s, centrifugo %s; want always and off", runs[0].PGWrites, runs[1].PGWrites)
	}
	if cfg, _ := parseFlags([]string{"-scenario", "churn"}, io.Discard); cfg.runs()[0].Target != "pushd" {
		t.Error("the default target is not pushd")
	}
}
