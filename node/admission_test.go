package node_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pushd/pushd/admission"
	"github.com/pushd/pushd/auth"
	"github.com/pushd/pushd/internal/testenv"
	"github.com/pushd/pushd/node"
)

// refusal is a 429's body.
type refusal struct {
	Error        string `json:"error"`
	RetryAfter   *int64 `json:"retry_after"` // a pointer: absent is not 0
	RetryAfterMS int64  `json:"retry_after_ms"`
	Message      string `json:"message"`
}

// want429 checks a refusal: status, code, a wait within max in
// retry_after_ms, and retry_after equal to Retry-After, both the
// milliseconds rounded up to whole seconds.
func want429(t *testing.T, status int, h http.Header, body, code string, maxWait time.Duration) refusal {
	t.Helper()
	if status != http.StatusTooManyRequests {
		t.Fatalf("status %d (%s), want 429", status, body)
	}
	var r refusal
	if err := json.Unmarshal([]byte(body), &r); err != nil || r.Error != code || r.Message == "" {
		t.Fatalf("body %s, want error %q with a message", body, code)
	}
	if r.RetryAfterMS <= 0 || time.Duration(r.RetryAfterMS)*time.Millisecond > maxWait {
		t.Fatalf("retry_after_ms %d, want (0, %s]", r.RetryAfterMS, maxWait)
	}
	wantWait(t, body, r.RetryAfter, r.RetryAfterMS)
	if got := h.Get("Retry-After"); got != strconv.FormatInt(*r.RetryAfter, 10) {
		t.Fatalf("Retry-After %q, want retry_after %d of the body %s", got, *r.RetryAfter, body)
	}
	return r
}

// wantWait checks that a refusal's retry_after is there and is its
// retry_after_ms in whole seconds rounded up:
// retry_after*1000 >= retry_after_ms > (retry_after-1)*1000.
func wantWait(t *testing.T, what string, secs *int64, ms int64) {
	t.Helper()
	if secs == nil || ms <= 0 || *secs*1000 < ms || ms <= (*secs-1)*1000 {
		t.Fatalf("%s: retry_after %v, retry_after_ms %d; want the milliseconds rounded up to whole seconds", what, ptrString(secs), ms)
	}
}

func ptrString(p *int64) string {
	if p == nil {
		return "absent"
	}
	return strconv.FormatInt(*p, 10)
}

// sseStatus opens an SSE stream and returns its status (closing it when
// the test ends); body is a refusal's.
func sseStatus(t *testing.T, base, tok string) (int, http.Header, string, *sseClient) {
	t.Helper()
	c := openSSE(t, base, tok, "task="+testenv.UniqueID("task"))
	return c.Status, c.Header, c.Body, c
}

// wsStatus dials a WebSocket and returns the handshake's status.
func wsStatus(t *testing.T, base, tok string) (int, http.Header, string, *wsClient) {
	t.Helper()
	c, resp, err := dialWS(t, base, tok, nil)
	if err == nil {
		return http.StatusSwitchingProtocols, resp.Header, "", c
	}
	if resp == nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, string(b), nil
}

func admissionNode(t *testing.T, c *cluster, a admission.Config) *server {
	t.Helper()
	cfg := c.config()
	if a.Timeout == 0 {
		// The shared Redis is busy under -race; these tests are not about
		// falling back, which a slow answer would trigger.
		a.Timeout = 2 * time.Second
	}
	cfg.Admission = a
	return startNode(t, cfg)
}

func TestConnectRateLimitRefusesThenAdmitsAfterRefill(t *testing.T) {
	c := newCluster(t)
	srv := admissionNode(t, c, admission.Config{ConnectUserBurst: 2, ConnectUserRate: 2})
	tok := token(t, "t1", testenv.UniqueID("user"))
	for range 2 {
		if st, _, body, _ := sseStatus(t, srv.URL, tok); st != http.StatusOK {
			t.Fatalf("within the burst: %d %s", st, body)
		}
	}
	// Both transports are refused before any stream starts.
	st, h, body, _ := sseStatus(t, srv.URL, tok)
	want429(t, st, h, body, "rate_limit_exceeded", 500*time.Millisecond)
	st, h, body, _ = wsStatus(t, srv.URL, tok)
	want429(t, st, h, body, "rate_limit_exceeded", 500*time.Millisecond)
	// Another user is not affected.
	if st, _, body, _ := sseStatus(t, srv.URL, token(t, "t1", testenv.UniqueID("user"))); st != http.StatusOK {
		t.Fatalf("another user: %d %s", st, body)
	}
	testenv.Eventually(t, "admitted after the bucket refilled", func() bool {
		st, _, _, _ := wsStatus(t, srv.URL, tok)
		return st == http.StatusSwitchingProtocols
	})
	if n := srv.Admission().Stats().Rejected[admission.RuleConnectUser]; n < 2 {
		t.Fatalf("connect_user rejections counted: %d", n)
	}
}

// sseFrom opens an SSE stream from a given loopback source address.
func sseFrom(t *testing.T, base, tok, ip string) (int, http.Header, string) {
	t.Helper()
	resp, body := openStream(t, clientFrom(ip), base+"/v1/events?task=x1&access_token="+url.QueryEscape(tok))
	return resp.StatusCode, resp.Header, string(body)
}

func TestConnectRateLimitPerIP(t *testing.T) {
	c := newCluster(t)
	srv := admissionNode(t, c, admission.Config{ConnectIPBurst: 2, ConnectIPRate: 0.01})
	for i := range 2 {
		if st, _, body := sseFrom(t, srv.URL, token(t, "t1", testenv.UniqueID("user")), "127.0.0.2"); st != http.StatusOK {
			t.Fatalf("connect %d from 127.0.0.2: %d %s", i, st, body)
		}
	}
	st, h, body := sseFrom(t, srv.URL, token(t, "t1", testenv.UniqueID("user")), "127.0.0.2")
	want429(t, st, h, body, "rate_limit_exceeded", 100*time.Second)
	if st, _, body := sseFrom(t, srv.URL, token(t, "t1", testenv.UniqueID("user")), "127.0.0.3"); st != http.StatusOK {
		t.Fatalf("another IP: %d %s", st, body)
	}
}

func TestAPIPlanLimits(t *testing.T) {
	c := newCluster(t)
	srv := admissionNode(t, c, admission.Config{Plans: admission.DefaultPlans()})
	free, pro, configured := testenv.UniqueID("free"), testenv.UniqueID("pro"), testenv.UniqueID("cfg")
	// The configured tenant's plan comes from its tenant hash.
	c.redis.Client.HSet(context.Background(), c.redis.Names.Prefix+"tenant:"+configured, "plan", "pro")
	signer := auth.NewSigner(testSecret)
	proTok, err := signer.Sign(auth.Principal{TenantID: pro, UserID: "u1", Plan: "pro", ExpiresAt: time.Now().Add(time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	freeTok, cfgTok := token(t, free, "u1"), token(t, configured, "u1")
	get := func(tok string) (*http.Response, []byte) {
		return httpDo(t, http.MethodGet, srv.URL+"/v1/tasks/task_1", tok, "")
	}
	for i := range 60 {
		if resp, body := get(freeTok); resp.StatusCode != http.StatusNotFound {
			t.Fatalf("free call %d: %d %s", i+1, resp.StatusCode, body)
		}
	}
	resp, body := get(freeTok)
	want429(t, resp.StatusCode, resp.Header, string(body), "rate_limit_exceeded", time.Minute)
	// Another endpoint has a window of its own.
	if resp, body := httpDo(t, http.MethodGet, srv.URL+"/v1/tasks?ids=task_1", freeTok, ""); resp.StatusCode != http.StatusOK {
		t.Fatalf("another endpoint: %d %s", resp.StatusCode, body)
	}
	for _, tok := range []string{proTok, cfgTok} {
		for i := range 61 {
			if resp, body := get(tok); resp.StatusCode != http.StatusNotFound {
				t.Fatalf("pro call %d: %d %s", i+1, resp.StatusCode, body)
			}
		}
	}
}

// countKey reads a connection count from Redis.
func countKey(t *testing.T, rdb *redis.Client, key string) int64 {
	t.Helper()
	v, err := rdb.Get(context.Background(), key).Int64()
	if err != nil && err != redis.Nil {
		t.Fatal(err)
	}
	return v
}

func TestUserCapAcrossTwoNodes(t *testing.T) {
	c := newCluster(t)
	a := admission.Config{MaxConnsPerUser: 2, LeaseTTL: 2 * time.Second, RenewInterval: 200 * time.Millisecond, ReconcileInterval: 200 * time.Millisecond}
	n1, n2 := admissionNode(t, c, a), admissionNode(t, c, a)
	user := testenv.UniqueID("user")
	tok := token(t, "t1", user)
	userKey := c.redis.Names.Prefix + "conn:{t1}:user:" + user

	_, _, _, s1 := sseStatus(t, n1.URL, tok)
	if s1.Status != http.StatusOK {
		t.Fatalf("first on node 1: %d %s", s1.Status, s1.Body)
	}
	if st, _, body, _ := wsStatus(t, n2.URL, tok); st != http.StatusSwitchingProtocols {
		t.Fatalf("second on node 2: %d %s", st, body)
	}
	// The cap holds across both nodes, on both transports.
	for _, base := range []string{n1.URL, n2.URL} {
		st, h, body, _ := sseStatus(t, base, tok)
		want429(t, st, h, body, api429Code, 10*time.Second)
		st, h, body, _ = wsStatus(t, base, tok)
		want429(t, st, h, body, api429Code, 10*time.Second)
	}
	// Closing a connection frees its slot at once (well before the lease
	// would expire: renewals keep it alive).
	s1.Close()
	testenv.Eventually(t, "slot freed by the close", func() bool { return countKey(t, c.redis.Client, userKey) == 1 })
	if st, _, body, _ := sseStatus(t, n1.URL, tok); st != http.StatusOK {
		t.Fatalf("after a close: %d %s", st, body)
	}
	wantMetric(t, n1.AdminURL, `pushd_admission_rejected_total{rule="user_cap"} 2`)

	// A count corrupted by hand is repaired by the periodic reconcile.
	c.redis.Client.Set(context.Background(), userKey, 40, 0)
	testenv.Eventually(t, "count repaired", func() bool { return countKey(t, c.redis.Client, userKey) == 2 })
	testenv.Eventually(t, "difference reported", func() bool {
		return n1.Admission().Stats().ReconcileDiff+n2.Admission().Stats().ReconcileDiff >= 38
	})
}

func TestLeasesOfACutNodeExpire(t *testing.T) {
	c := newCluster(t)
	a := admission.Config{MaxConnsPerUser: 2, LeaseTTL: time.Second, RenewInterval: 200 * time.Millisecond, Timeout: time.Second}
	live := admissionNode(t, c, a)

	// The doomed node reaches Redis through a proxy that will cut it off.
	u, _ := url.Parse(c.redis.URL)
	proxy := testenv.StartProxy(t, u.Host)
	cfg := c.config()
	cfg.RedisURL = strings.Replace(c.redis.URL, u.Host, proxy.Addr, 1)
	cfg.Admission = a
	doomed := startNode(t, cfg)

	user := testenv.UniqueID("user")
	tok := token(t, "t1", user)
	for range 2 {
		if st, _, body, _ := sseStatus(t, doomed.URL, tok); st != http.StatusOK {
			t.Fatalf("on the doomed node: %d %s", st, body)
		}
	}
	st, h, body, _ := sseStatus(t, live.URL, tok)
	want429(t, st, h, body, api429Code, 10*time.Second)

	// Cut off, the node can neither renew nor release; its clients are
	// still connected to it. The slots come back when the leases expire.
	proxy.CloseAll()
	proxy.Drop() // after CloseAll, which would let new connections through
	testenv.Eventually(t, "slots freed by lease expiry", func() bool {
		st, _, _, cl := sseStatus(t, live.URL, tok)
		if cl != nil && st == http.StatusOK {
			cl.Close()
		}
		return st == http.StatusOK
	})
	// The two leases expire a moment apart, and an acquire frees what has
	// expired by then: the first admission may have freed only one.
	testenv.Eventually(t, "both of the cut node's leases counted as expired", func() bool {
		if st, _, _, cl := sseStatus(t, live.URL, tok); cl != nil && st == http.StatusOK {
			cl.Close()
		}
		return live.Admission().Stats().LeasesExpired >= 2
	})
}

func TestControlRedisDownFallsBackToLocalLimits(t *testing.T) {
	c := newCluster(t)
	control := testenv.StartRedis(t)
	cfg := c.config()
	cfg.RedisControlURL = control.URL
	// Fleet cap 2 over 2 expected nodes: a share of 1 while Redis is down.
	cfg.Admission = admission.Config{MaxConnsPerUser: 2, ExpectedNodes: 2, RetryAfterFailure: 200 * time.Millisecond,
		LeaseTTL: 5 * time.Second, RenewInterval: 200 * time.Millisecond}
	srv := startNode(t, cfg)
	user := testenv.UniqueID("user")
	tok := token(t, "t1", user)
	rdb := control.Client()
	userKey := c.redis.Names.Prefix + "conn:{t1}:user:" + user
	// The shared Redis (cache, realtime) holds none of the control keys.
	if n := countKey(t, c.redis.Client, userKey); n != 0 {
		t.Fatalf("the cache Redis has a lease count")
	}

	control.Stop()
	_, _, _, first := sseStatus(t, srv.URL, tok)
	if first.Status != http.StatusOK {
		t.Fatalf("Redis down: %d %s, want admitted on local limits", first.Status, first.Body)
	}
	st, h, body, _ := wsStatus(t, srv.URL, tok)
	want429(t, st, h, body, api429Code, 10*time.Second) // the local share is 1
	if srv.Admission().Stats().Fallbacks < 2 {
		t.Fatalf("fallbacks %d", srv.Admission().Stats().Fallbacks)
	}
	resp, mbody := httpDo(t, http.MethodGet, srv.AdminURL+"/metrics", "", "")
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(mbody), "\npushd_admission_store_up 0\n") || strings.Contains(string(mbody), "\npushd_admission_fallbacks_total 0\n") {
		t.Fatalf("metrics do not show the fallback")
	}

	control.Start()
	// Back on Redis: the lease taken locally is written there, and the
	// fleet cap (2) applies again, counting it.
	testenv.Eventually(t, "local lease written to Redis", func() bool { return countKey(t, rdb, userKey) == 1 })
	var second *wsClient
	testenv.Eventually(t, "Redis decides again", func() bool {
		st, _, _, ws := wsStatus(t, srv.URL, tok)
		second = ws
		return st == http.StatusSwitchingProtocols
	})
	st, h, body, _ = sseStatus(t, srv.URL, tok)
	want429(t, st, h, body, api429Code, 10*time.Second)
	if countKey(t, rdb, userKey) != 2 {
		t.Fatalf("Redis count %d, want 2", countKey(t, rdb, userKey))
	}
	// Nothing leaks: both connections, the one admitted while Redis was
	// down included, give their slots back.
	first.Close()
	second.Close()
	testenv.Eventually(t, "released", func() bool { return countKey(t, rdb, userKey) == 0 })
}

const api429Code = "too_many_connections"

// keysOf lists a server's keys.
func keysOf(t *testing.T, rdb *redis.Client) []string {
	t.Helper()
	ks, err := rdb.Keys(context.Background(), "*").Result()
	if err != nil {
		t.Fatal(err)
	}
	return ks
}

func TestRedisRolesOnThreeServers(t *testing.T) {
	cache, control, realtime := testenv.StartRedis(t), testenv.StartRedis(t), testenv.StartRedis(t)
	srv := startNode(t, node.Config{
		RedisURL: realtime.URL, RedisCacheURL: cache.URL, RedisControlURL: control.URL, RedisRealtimeURL: realtime.URL,
		Admission: admission.Config{ConnectUserBurst: 10, ConnectUserRate: 1, ConnectIPBurst: 10, ConnectIPRate: 1,
			MaxConnsPerUser: 5, Plans: admission.DefaultPlans()},
	})
	tok := token(t, "t1", "u1")
	sc := openSSE(t, srv.URL, tok, "task=task_r1")
	if sc.Status != http.StatusOK {
		t.Fatalf("SSE %d %s", sc.Status, sc.Body)
	}
	ws := openWS(t, srv.URL, tok)
	ws.send(t, map[string]any{"op": "subscribe", "id": 1, "tasks": []string{"task_r1"}})
	ws.NextOf(t, "ack")
	resp, body := httpDo(t, http.MethodPost, srv.URL+"/v1/publish", "", doc("task_r1", "t1", 3, "RUNNING"))
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("publish %d %s", resp.StatusCode, body)
	}
	for {
		ev := sc.Next(t)
		if ev.Event == "task" {
			if s := parseDoc(t, ev.Data); s.Version != 3 {
				t.Fatalf("SSE got v%d", s.Version)
			}
			break
		}
	}
	if s := ws.nextTask(t); s.Version != 3 {
		t.Fatalf("WebSocket got v%d", s.Version)
	}
	if resp, body := httpDo(t, http.MethodGet, srv.URL+"/v1/tasks/task_r1", tok, ""); resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %d %s", resp.StatusCode, body)
	}

	for _, k := range keysOf(t, cache.Client()) {
		if !strings.HasPrefix(k, "task:") {
			t.Errorf("cache Redis has %q", k)
		}
	}
	var sawLease, sawBucket, sawWindow bool
	for _, k := range keysOf(t, control.Client()) {
		switch {
		case strings.HasPrefix(k, "conn:"):
			sawLease = true
		case strings.HasPrefix(k, "rl:conn:"):
			sawBucket = true
		case strings.HasPrefix(k, "rl:api:"):
			sawWindow = true
		default:
			t.Errorf("control Redis has %q", k)
		}
	}
	if !sawLease || !sawBucket || !sawWindow {
		t.Errorf("control Redis lacks leases (%v), buckets (%v) or windows (%v)", sawLease, sawBucket, sawWindow)
	}
	if ks := keysOf(t, realtime.Client()); len(ks) != 0 {
		t.Errorf("realtime Redis has keys %q", ks)
	}
	// Pub/Sub is on the realtime server only.
	for name, rs := range map[string]*testenv.RedisServer{"cache": cache, "control": control, "realtime": realtime} {
		chans, err := rs.Client().PubSubChannels(context.Background(), "task.changed.*").Result()
		if err != nil {
			t.Fatal(err)
		}
		if (len(chans) > 0) != (name == "realtime") {
			t.Errorf("%s Redis has subscribed channels %q", name, chans)
		}
	}
}
