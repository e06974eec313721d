package node_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/pushd/pushd/internal/testenv"
	"github.com/pushd/pushd/node"
)

// clientFrom is an HTTP client whose connections come from ip, a loopback
// address other than 127.0.0.1.
func clientFrom(ip string) *http.Client {
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}, Timeout: waitFor}
	return &http.Client{Transport: &http.Transport{DialContext: d.DialContext, DisableKeepAlives: true}}
}

// openStream opens an SSE stream through client and returns the response: the
// open stream on 200, the refusal otherwise (its body read).
func openStream(t *testing.T, client *http.Client, u string) (*http.Response, []byte) {
	t.Helper()
	return openStreamWith(t, client, u, nil)
}

// openStreamWith is openStream with request headers.
func openStreamWith(t *testing.T, client *http.Client, u string, header http.Header) (*http.Response, []byte) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	for k, v := range header {
		req.Header[k] = v
	}
	resp, err := client.Do(req)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cancel()
		resp.Body.Close()
	})
	if resp.StatusCode == http.StatusOK {
		return resp, nil
	}
	body, _ := io.ReadAll(resp.Body)
	return resp, body
}

// waitConns waits until the node holds n connections.
func waitConns(t *testing.T, s *server, n int) {
	t.Helper()
	testenv.Eventually(t, fmt.Sprintf("the node holds %d connections", n), func() bool { return s.Hub().Len() == n })
}

func TestConnectionsPerAddressOnANode(t *testing.T) {
	c := newCluster(t)
	cfg := c.config()
	cfg.API.MaxConnsPerIP = 2
	s := startNode(t, cfg)
	task := testenv.UniqueID("task")
	c.goPublish(t, doc(task, "t1", 1, "RUNNING"))
	u := s.URL + "/v1/events?task=" + task + "&access_token=" + token(t, "t1", "u1")
	here, there := clientFrom("127.0.0.1"), clientFrom("127.0.0.2")

	first, _ := openStream(t, here, u)
	openStream(t, here, u)
	waitConns(t, s, 2)
	resp, body := openStream(t, here, u)
	want429(t, resp.StatusCode, resp.Header, string(body), "too_many_connections", 5*time.Second)
	if resp, body := openStream(t, there, u); resp.StatusCode != http.StatusOK {
		t.Fatalf("another address refused: %d %s", resp.StatusCode, body)
	}
	// The head is written before the hub registers a stream: wait for it.
	waitConns(t, s, 3)
	// A closed stream frees its slot.
	first.Body.Close()
	waitConns(t, s, 2)
	if resp, body := openStream(t, here, u); resp.StatusCode != http.StatusOK {
		t.Fatalf("after one closed: %d %s", resp.StatusCode, body)
	}
}

func TestNodeFullAnswers503(t *testing.T) {
	c := newCluster(t)
	cfg := c.config()
	cfg.MaxConns = 2
	s := startNode(t, cfg)
	task := testenv.UniqueID("task")
	c.goPublish(t, doc(task, "t1", 1, "RUNNING"))
	tok := token(t, "t1", "u1")
	u := s.URL + "/v1/events?task=" + task + "&access_token=" + tok
	openStream(t, clientFrom("127.0.0.1"), u)
	openStream(t, clientFrom("127.0.0.2"), u)
	waitConns(t, s, 2)
	resp, body := openStream(t, clientFrom("127.0.0.3"), u)
	wantError(t, resp, body, http.StatusServiceUnavailable, "over_capacity")
	if resp.Header.Get("Retry-After") == "" {
		t.Fatal("503 without Retry-After")
	}
	// A WebSocket upgrade is refused the same way, before it is upgraded.
	_, resp, err := dialWS(t, s.URL, tok, nil)
	if err == nil || resp == nil || resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("WebSocket on a full node: %v, %v", resp, err)
	}
}

func TestOversizedHeadersAreRefused(t *testing.T) {
	c := newCluster(t)
	s := startNode(t, c.config())
	resp, _ := httpDo(t, http.MethodGet, s.URL+"/healthz", "", "", "X-Padding", strings.Repeat("a", 70<<10))
	if resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
		t.Fatalf("70 KB of headers: %d, want 431", resp.StatusCode)
	}
}

// Behind a trusted load balancer, the per-address limit counts the client
// X-Forwarded-For names; a header from any other peer is ignored, so a
// client cannot pick the address it is counted under.
func TestTrustedProxyNamesTheClient(t *testing.T) {
	c := newCluster(t)
	cfg := c.config()
	cfg.API.MaxConnsPerIP = 1
	_, lb, _ := net.ParseCIDR("127.0.0.1/32")
	cfg.API.TrustedProxies = []*net.IPNet{lb}
	s := startNode(t, cfg)
	task := testenv.UniqueID("task")
	c.goPublish(t, doc(task, "t1", 1, "RUNNING"))
	u := s.URL + "/v1/events?task=" + task + "&access_token=" + token(t, "t1", "u1")
	open := func(client *http.Client, forwardedFor string) (*http.Response, []byte) {
		t.Helper()
		return openStreamWith(t, client, u, http.Header{"X-Forwarded-For": {forwardedFor}})
	}
	balancer, other := clientFrom("127.0.0.1"), clientFrom("127.0.0.2")

	for i, client := range []string{"203.0.113.7", "203.0.113.8", "198.51.100.1, 203.0.113.9"} {
		if resp, body := open(balancer, client); resp.StatusCode != http.StatusOK {
			t.Fatalf("client %s through the balancer: %d %s", client, resp.StatusCode, body)
		}
		waitConns(t, s, i+1)
	}
	resp, body := open(balancer, "203.0.113.7")
	want429(t, resp.StatusCode, resp.Header, string(body), "too_many_connections", 5*time.Second)

	// Not the balancer: its header counts for nothing.
	if resp, body := open(other, "203.0.113.10"); resp.StatusCode != http.StatusOK {
		t.Fatalf("a direct client: %d %s", resp.StatusCode, body)
	}
	waitConns(t, s, 4)
	resp, body = open(other, "203.0.113.11")
	want429(t, resp.StatusCode, resp.Header, string(body), "too_many_connections", 5*time.Second)
}

// burst opens n SSE streams at u all at once from the address of client
// and returns the status of each; the open ones stay open until the test
// ends. A request in flight between the caps' check and its stream's
// registration used to be counted by neither.
func burst(t *testing.T, client *http.Client, u string, n int) map[int]int {
	t.Helper()
	type result struct {
		resp *http.Response
		err  error
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	start := make(chan struct{})
	results := make(chan result, n)
	for range n {
		go func() {
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
			<-start
			resp, err := client.Do(req)
			results <- result{resp, err}
		}()
	}
	close(start)
	statuses := map[int]int{}
	for range n {
		r := <-results
		if r.err != nil {
			t.Fatalf("a request of the burst: %v", r.err)
		}
		t.Cleanup(func() { r.resp.Body.Close() })
		statuses[r.resp.StatusCode]++
	}
	return statuses
}

// TestCapsHoldUnderConcurrentConnects: 40 streams asked for at once from
// one address hold exactly the cap's number, whether the cap is the
// address's (--max-conns-per-ip), the user's (fleet-wide lease) or the
// node's (--max-conns); the rest are refused for that cap.
func TestCapsHoldUnderConcurrentConnects(t *testing.T) {
	c := newCluster(t)
	task := testenv.UniqueID("task")
	c.goPublish(t, doc(task, "t1", 1, "RUNNING"))
	const n = 40
	for _, tc := range []struct {
		name   string
		set    func(*node.Config)
		cap    int
		status int
	}{
		{"per address", func(cfg *node.Config) { cfg.API.MaxConnsPerIP = 12 }, 12, http.StatusTooManyRequests},
		{"per user", func(cfg *node.Config) { cfg.Admission.MaxConnsPerUser = 7 }, 7, http.StatusTooManyRequests},
		{"per node", func(cfg *node.Config) { cfg.MaxConns = 9 }, 9, http.StatusServiceUnavailable},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := c.config()
			cfg.API.MaxConnsPerIP = 0
			// Each admission is a round trip to Redis, as in production:
			// the connect buckets (wide open here) and the session.
			cfg.Admission.ConnectIPBurst, cfg.Admission.ConnectIPRate = 1000, 1000
			tc.set(&cfg)
			s := startNode(t, cfg)
			sess := sessionToken()
			if err := c.redis.Client.Set(context.Background(), c.redis.Names.Prefix+"session:"+sess, `{"tenant_id":"t1","user_id":"`+testenv.UniqueID("u")+`"}`, time.Hour).Err(); err != nil {
				t.Fatal(err)
			}
			u := s.URL + "/v1/events?task=" + task + "&access_token=" + sess
			client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: n}}
			got := burst(t, client, u, n)
			if got[http.StatusOK] != tc.cap || got[tc.status] != n-tc.cap {
				t.Fatalf("%d requests at once against a cap of %d: statuses %v; want %d streams and %d refused %d", n, tc.cap, got, tc.cap, n-tc.cap, tc.status)
			}
			waitConns(t, s, tc.cap)
		})
	}
}
