package node_test

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pushd/pushd/admission"
	"github.com/pushd/pushd/db"
	"github.com/pushd/pushd/internal/testenv"
	"github.com/pushd/pushd/node"
)

// expiredAt reads c until the server says its token expired and returns
// when that arrived; it fails when nothing of the kind comes by deadline.
func (c *sseClient) expiredAt(t *testing.T, name string, deadline time.Time) time.Time {
	t.Helper()
	timer := time.NewTimer(time.Until(deadline))
	defer timer.Stop()
	for {
		select {
		case ev, ok := <-c.Events():
			if !ok {
				t.Fatalf("%s: SSE stream ended without token_expired", name)
			}
			if ev.Event != "error" {
				continue
			}
			at := time.Now()
			var e struct {
				Code   string
				TaskID string `json:"task_id"`
			}
			if err := json.Unmarshal([]byte(ev.Data), &e); err != nil || e.Code != "token_expired" && e.TaskID == "" {
				t.Fatalf("%s: error event %s, want code token_expired", name, ev.Data)
			}
			if e.Code == "token_expired" {
				return at
			}
		case <-timer.C:
			t.Fatalf("%s: no token_expired by %s", name, deadline.Format(time.RFC3339Nano))
		}
	}
}

// A session ends its streams at its expires_at, whether the node read it
// from PostgreSQL or, for a later connection, from the Redis copy it wrote
// back; re-validation, far off here, plays no part.
func TestSessionStreamsEndAtExpiresAt(t *testing.T) {
	c := newCluster(t)
	cfg := c.config()
	cfg.Hub.HeartbeatInterval = 100 * time.Millisecond // the expiry check runs on the heartbeat tick
	cfg.Admission = admission.Config{SessionCheckInterval: time.Hour}
	srv := startNode(t, cfg)
	ctx := context.Background()
	tok := sessionToken()
	var expires time.Time
	if err := c.pg.Pool.QueryRow(ctx, `INSERT INTO sessions (token, tenant_id, user_id, plan, expires_at)
		VALUES ($1, 't1', 'u1', '', now() + interval '2 seconds') RETURNING expires_at`, tok).Scan(&expires); err != nil {
		t.Fatal(err)
	}
	fromPG := openSSE(t, srv.URL, tok, "task=x1")
	if fromPG.Status != 200 {
		t.Fatalf("SSE with a PostgreSQL session: %d %s", fromPG.Status, fromPG.Body)
	}
	key := c.redis.Names.Prefix + "session:" + tok
	if n := c.redis.Client.Exists(ctx, key).Val(); n != 1 {
		t.Fatal("the session was not written back to Redis")
	}
	fromRedis := openSSE(t, srv.URL, tok, "task=x1")
	if fromRedis.Status != 200 {
		t.Fatalf("SSE with the cached session: %d %s", fromRedis.Status, fromRedis.Body)
	}
	const bound = time.Second // the tick is 50ms; the rest is a loaded machine's slack
	for _, sc := range []struct {
		name string
		*sseClient
	}{{"session from PostgreSQL", fromPG}, {"session from the Redis cache", fromRedis}} {
		late := sc.expiredAt(t, sc.name, expires.Add(5*time.Second)).Sub(expires)
		t.Logf("%s: token_expired %v after expires_at", sc.name, late)
		if late < -50*time.Millisecond || late > bound {
			t.Errorf("%s: token_expired %v after expires_at, want within [-50ms, %v]", sc.name, late, bound)
		}
		sc.Ended(t)
	}
}

// jwtWith signs claims with the nodes' test secret, as another issuer or
// service might.
func jwtWith(t *testing.T, claims jwt.MapClaims) string {
	t.Helper()
	s, err := jwt.NewWithClaims(jwt.SigningMethodHS256, claims).SignedString(testSecret)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// A node set up with an audience, an issuer and a longest token lifetime
// of an hour refuses tokens made for another service, by another issuer or
// for too long, and accepts the right ones; a node without an audience or
// an issuer and with a lifetime bound of two days accepts all of them.
func TestJWTAudienceIssuerAndMaxTTL(t *testing.T) {
	c := newCluster(t)
	cfg := c.config()
	cfg.JWTAudience = []string{"pushd", "pushd-staging"}
	cfg.JWTIssuer = "https://login.example"
	cfg.JWTMaxTTL = time.Hour
	strict := startNode(t, cfg)
	laxCfg := c.config()
	laxCfg.JWTMaxTTL = 48 * time.Hour // past every lifetime below: 24h10m at most
	lax := startNode(t, laxCfg)

	now := time.Now()
	claims := func(edit func(jwt.MapClaims)) string {
		m := jwt.MapClaims{"sub": "u1", "tenant_id": "t1", "aud": "pushd", "iss": "https://login.example",
			"iat": now.Unix(), "exp": now.Add(30 * time.Minute).Unix()}
		edit(m)
		return jwtWith(t, m)
	}
	cases := []struct {
		name    string
		tok     string
		refused bool // by the strict node; the lax one takes every token here
	}{
		{"right audience and issuer", claims(func(jwt.MapClaims) {}), false},
		{"one of the audiences among others", claims(func(m jwt.MapClaims) { m["aud"] = []string{"billing", "pushd-staging"} }), false},
		{"lifetime of exactly the limit", claims(func(m jwt.MapClaims) { m["exp"] = now.Add(time.Hour).Unix() }), false},
		{"no iat, expiring within the limit", claims(func(m jwt.MapClaims) { delete(m, "iat") }), false},
		{"another service's audience", claims(func(m jwt.MapClaims) { m["aud"] = "billing" }), true},
		{"no audience", claims(func(m jwt.MapClaims) { delete(m, "aud") }), true},
		{"another issuer", claims(func(m jwt.MapClaims) { m["iss"] = "https://evil.example" }), true},
		{"no issuer", claims(func(m jwt.MapClaims) { delete(m, "iss") }), true},
		{"exp - iat over the limit", claims(func(m jwt.MapClaims) { m["exp"] = now.Add(2 * time.Hour).Unix() }), true},
		{"exp - iat over the limit, issued long ago", claims(func(m jwt.MapClaims) {
			m["iat"], m["exp"] = now.Add(-24*time.Hour).Unix(), now.Add(10*time.Minute).Unix()
		}), true},
		{"no iat, expiring past the limit", claims(func(m jwt.MapClaims) { delete(m, "iat"); m["exp"] = now.Add(2 * time.Hour).Unix() }), true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			// A task that does not exist: 404 means the token was taken.
			resp, body := httpDo(t, http.MethodGet, strict.URL+"/v1/tasks/task_absent", tc.tok, "")
			if tc.refused {
				wantError(t, resp, body, http.StatusUnauthorized, "unauthorized")
				if sc := openSSE(t, strict.URL, tc.tok, "task=task_absent"); sc.Status != http.StatusUnauthorized {
					t.Fatalf("SSE: %d %s, want 401", sc.Status, sc.Body)
				}
			} else {
				wantError(t, resp, body, http.StatusNotFound, "not_found")
			}
			resp, body = httpDo(t, http.MethodGet, lax.URL+"/v1/tasks/task_absent", tc.tok, "")
			wantError(t, resp, body, http.StatusNotFound, "not_found")
		})
	}
}

// A flood of unknown session tokens from one client address is refused
// with 429 before it reaches PostgreSQL, past a small burst; another
// address is not held back by it.
func TestBadTokenFloodIsLimitedPerAddress(t *testing.T) {
	c := newCluster(t)
	cfg := c.config()
	app := "pushd_flood_" + testenv.RandomSuffix(4)
	cfg.DatabaseURL = c.pg.AppURL(app) // the node's backends, to flush their statistics
	_, lb, _ := net.ParseCIDR("127.0.0.1/32")
	cfg.API.TrustedProxies = []*net.IPNet{lb}                 // the test speaks for clients through X-Forwarded-For
	cfg.API.AuthFailureBurst, cfg.API.AuthFailureRate = 20, 1 // the flags' defaults
	srv := startNode(t, cfg)
	before := c.pg.TableScans(t, "sessions") // a session lookup is one scan

	get := func(from, tok string) (int, http.Header, string) {
		return getFrom(t, srv.URL+"/v1/tasks/task_absent", from, tok)
	}
	const flood = 2000
	statuses, refusal := floodFrom(t, srv.URL+"/v1/tasks/task_absent", "203.0.113.7", flood)

	// Another address still has its own allowance: a bad token there is a
	// plain 401 (one more lookup), and a good one goes through.
	status, h, body := get("203.0.113.8", sessionToken())
	wantError(t, &http.Response{StatusCode: status, Header: h}, []byte(body), http.StatusUnauthorized, "unauthorized")
	status, h, body = get("203.0.113.8", token(t, "t1", "u1"))
	wantError(t, &http.Response{StatusCode: status, Header: h}, []byte(body), http.StatusNotFound, "not_found")

	c.pg.FlushStats(t, app)
	lookups := c.pg.TableScans(t, "sessions") - before
	t.Logf("flood of %d unknown tokens: statuses %v; %d session lookups in PostgreSQL", flood, statuses, lookups)
	if statuses[http.StatusUnauthorized]+statuses[http.StatusTooManyRequests] != flood {
		t.Fatalf("statuses %v, want only 401 and 429", statuses)
	}
	if lookups > flood*5/100 {
		t.Errorf("%d session lookups for a flood of %d unknown tokens, want at most 5%%", lookups, flood)
	}
	if statuses[http.StatusTooManyRequests] < flood*95/100 {
		t.Fatalf("%d of %d refused with 429, want at least 95%%", statuses[http.StatusTooManyRequests], flood)
	}
	want429(t, http.StatusTooManyRequests, refusal.h, refusal.body, "rate_limit_exceeded", time.Second)

	// Good tokens take nothing from an address's allowance: far more of
	// them than its burst all go through.
	good := token(t, "t1", "u1")
	for i := range 5 * cfg.API.AuthFailureBurst {
		status, _, body := get("203.0.113.9", good)
		if status != http.StatusNotFound {
			t.Fatalf("good token %d from one address: %d %s, want 404 (the failure limit counted a success)", i+1, status, body)
		}
	}
}

// With PostgreSQL's sessions table gone, every session lookup fails and
// its request is answered 503 unavailable. A failed lookup takes from the
// address's failed-authentication bucket as an invalid token does, so a
// flood of session tokens from one address reaches PostgreSQL about burst
// times (each a transaction that rolls back) and is answered 429 past them.
func TestSessionStoreFailuresAreLimitedPerAddress(t *testing.T) {
	ctx := context.Background()
	pg := ownDatabase(t) // its own: the test drops a table
	if _, err := pg.Pool.Exec(ctx, `DROP TABLE sessions`); err != nil {
		t.Fatal(err)
	}
	app := "pushd_nosessions_" + testenv.RandomSuffix(4)
	r := testenv.SharedRedis(t)
	cfg := node.Config{RedisURL: r.URL, KeyPrefix: r.Names.Prefix, DatabaseURL: pg.AppURL(app)}
	_, lb, _ := net.ParseCIDR("127.0.0.1/32")
	cfg.API.TrustedProxies = []*net.IPNet{lb} // the test speaks for clients through X-Forwarded-For
	const burst, rate = 20, 1.0               // the flags' defaults
	cfg.API.AuthFailureBurst, cfg.API.AuthFailureRate = burst, rate
	srv := startNode(t, cfg)
	before := rollbacks(t, pg)

	const flood = 800
	start := time.Now()
	statuses, refusal := floodFrom(t, srv.URL+"/v1/tasks/task_absent", "203.0.113.7", flood)
	elapsed := time.Since(start)
	pg.FlushStats(t, app)
	lookups := rollbacks(t, pg) - before
	allowed := burst + int(rate*elapsed.Seconds()) + 1
	t.Logf("flood of %d session tokens in %s with the sessions table missing: statuses %v; %d failed transactions in PostgreSQL (allowed %d)",
		flood, elapsed.Round(time.Millisecond), statuses, lookups, allowed)
	if statuses[http.StatusServiceUnavailable]+statuses[http.StatusTooManyRequests] != flood {
		t.Fatalf("statuses %v, want only 503 and 429", statuses)
	}
	if n := statuses[http.StatusServiceUnavailable]; n == 0 || n > allowed {
		t.Errorf("%d answered 503, want 1 to %d (the burst, and what the bucket refilled meanwhile)", n, allowed)
	}
	if lookups == 0 || lookups > int64(allowed) {
		t.Errorf("%d failed session lookups in PostgreSQL for a flood of %d, want 1 to %d", lookups, flood, allowed)
	}
	want429(t, http.StatusTooManyRequests, refusal.h, refusal.body, "rate_limit_exceeded", 2*time.Second)
}

// ownDatabase is a database of the test's own with the schema applied,
// for a test that breaks it; it is dropped when the test ends.
func ownDatabase(t *testing.T) testenv.Postgres {
	t.Helper()
	u := testenv.EmptyDatabase(t)
	pool, err := pgxpool.New(context.Background(), u)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if err := db.Migrate(context.Background(), pool); err != nil {
		t.Fatal(err)
	}
	return testenv.Postgres{URL: u, Pool: pool}
}

// rollbacks is how many transactions of pg's database failed, as the
// statistics count them: a query that fails (a missing table) is one.
// Counts of backends still running may lag: see FlushStats.
func rollbacks(t *testing.T, pg testenv.Postgres) int64 {
	t.Helper()
	var n int64
	if err := pg.Pool.QueryRow(context.Background(), `SELECT xact_rollback FROM pg_stat_database WHERE datname = current_database()`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// A token's lifetime is bounded by default: a JWT valid for ten years,
// with or without iat, is refused (401) by a node with default settings,
// and taken by a node whose operator set a longer bound.
func TestTenYearTokenRefusedByDefault(t *testing.T) {
	c := newCluster(t)
	def := startNode(t, c.config())
	cfg := c.config()
	cfg.JWTMaxTTL = 11 * 365 * 24 * time.Hour
	long := startNode(t, cfg)
	now := time.Now()
	exp := now.AddDate(10, 0, 0)
	for name, claims := range map[string]jwt.MapClaims{
		"with iat":    {"sub": "u1", "tenant_id": "t1", "iat": now.Unix(), "exp": exp.Unix()},
		"without iat": {"sub": "u1", "tenant_id": "t1", "exp": exp.Unix()},
	} {
		tok := jwtWith(t, claims)
		resp, body := httpDo(t, http.MethodGet, def.URL+"/v1/tasks/"+testenv.UniqueID("task"), tok, "")
		wantError(t, resp, body, http.StatusUnauthorized, "unauthorized")
		if resp, body := httpDo(t, http.MethodGet, long.URL+"/v1/tasks/"+testenv.UniqueID("task"), tok, ""); resp.StatusCode != http.StatusNotFound {
			t.Fatalf("%s: a node with --jwt-max-ttl 11y answered %d %s, want the token taken (404 for a task that does not exist)", name, resp.StatusCode, body)
		}
	}
}

// The demo's API (--demo beside Redis and PostgreSQL) checks bearer tokens,
// sessions with a lookup, and counts its failures against the client
// address's bucket as every other endpoint does: past the burst, made-up
// tokens are answered 429 before they are looked up, on the demo and on
// the API alike.
func TestDemoAuthenticationCountsAgainstTheAddress(t *testing.T) {
	c := newCluster(t)
	cfg := c.config()
	cfg.Demo = true
	cfg.API.AuthFailureBurst, cfg.API.AuthFailureRate = 5, 0.001 // no refill within the test
	srv := startNode(t, cfg)
	statuses := map[int]int{}
	for range 30 {
		resp, body := httpDo(t, http.MethodGet, srv.URL+"/demo/me", sessionToken(), "")
		statuses[resp.StatusCode]++
		if resp.StatusCode == http.StatusTooManyRequests {
			wantError(t, resp, body, http.StatusTooManyRequests, "rate_limit_exceeded")
		}
	}
	if statuses[http.StatusUnauthorized] != 5 || statuses[http.StatusTooManyRequests] != 25 {
		t.Fatalf("30 made-up session tokens on /demo/me: statuses %v; want 5 refused 401 and 25 answered 429", statuses)
	}
	resp, body := httpDo(t, http.MethodGet, srv.URL+"/v1/tasks/task_absent", sessionToken(), "")
	wantError(t, resp, body, http.StatusTooManyRequests, "rate_limit_exceeded")
	// The page and its files take no token and are served.
	if resp, body := httpDo(t, http.MethodGet, srv.URL+"/demo/config", "", ""); resp.StatusCode != http.StatusOK {
		t.Fatalf("/demo/config: %d %s", resp.StatusCode, body)
	}
}

// getFrom GETs u with a bearer token as the client from, named in
// X-Forwarded-For (the node trusts loopback as its proxy).
func getFrom(t *testing.T, u, from, tok string) (int, http.Header, string) {
	req, _ := http.NewRequest(http.MethodGet, u, nil)
	req.Header.Set("Authorization", "Bearer "+tok)
	req.Header.Set("X-Forwarded-For", from)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Error(err)
		return 0, nil, ""
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, string(b)
}

// refusal429 is one 429 of a flood, read whole.
type refusal429 struct {
	h    http.Header
	body string
}

// floodFrom GETs u n times (a multiple of 8) from 8 workers as the client
// from, each with a made-up session token, and counts the statuses; it
// keeps the first 429.
func floodFrom(t *testing.T, u, from string, n int) (map[int]int, refusal429) {
	t.Helper()
	const workers = 8
	var (
		mu       sync.Mutex
		statuses = map[int]int{}
		first    refusal429
		wg       sync.WaitGroup
	)
	for range workers {
		wg.Go(func() {
			for range n / workers {
				status, h, body := getFrom(t, u, from, sessionToken())
				mu.Lock()
				statuses[status]++
				if status == http.StatusTooManyRequests && first.h == nil {
					first = refusal429{h, body}
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return statuses, first
}
