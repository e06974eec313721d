package session_test

import (
	"context"
	"errors"
	"fmt"
	"net/http/httptest"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/pushd/pushd/auth"
	"github.com/pushd/pushd/auth/session"
	"github.com/pushd/pushd/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

var testSecret = []byte("0123456789abcdef0123456789abcdef")

func TestSessionsRedisThenPostgres(t *testing.T) {
	sessions, r, pg := sessionsOn(t, "pushd_auth_sessions_"+testenv.RandomSuffix(4), session.Config{})
	ctx := context.Background()
	v, err := auth.New(auth.Config{Secret: testSecret, Sessions: sessions})
	if err != nil {
		t.Fatal(err)
	}
	cached, stored, expired := "c_"+testenv.RandomSuffix(12), "s_"+testenv.RandomSuffix(12), "e_"+testenv.RandomSuffix(12)
	r.Client.Set(ctx, r.Names.Prefix+"session:"+cached, `{"tenant_id":"t1","user_id":"u1","plan":"enterprise"}`, time.Hour)
	if _, err := pg.Pool.Exec(ctx, `INSERT INTO sessions (token, tenant_id, user_id, plan, expires_at) VALUES
		($1, 't2', 'u2', '', now() + interval '10 minutes'), ($2, 't3', 'u3', '', now() - interval '1 minute')`, stored, expired); err != nil {
		t.Fatal(err)
	}
	authn := func(tok string) (auth.Principal, error) {
		req := httptest.NewRequest("GET", "/v1/events", nil)
		req.Header.Set("Authorization", "Bearer "+tok)
		return v.Authenticate(req)
	}
	if p, err := authn(cached); err != nil || p.TenantID != "t1" || p.UserID != "u1" || p.Plan != "enterprise" || p.Session != cached {
		t.Fatalf("cached session: %+v, %v", p, err)
	}
	p, err := authn(stored)
	if err != nil || p.TenantID != "t2" || p.ExpiresAt.IsZero() {
		t.Fatalf("stored session: %+v, %v", p, err)
	}
	if ttl := r.Client.TTL(ctx, r.Names.Prefix+"session:"+stored).Val(); ttl <= 0 || ttl > 10*time.Second {
		t.Fatalf("written back with TTL %s, want the copy's 10s at most", ttl)
	}
	for _, tok := range []string{expired, "unknown_" + testenv.RandomSuffix(8), "bad-token!-0123456789"} {
		if _, err := authn(tok); !errors.Is(err, auth.ErrInvalidToken) {
			t.Fatalf("%q: %v, want ErrInvalidToken", tok, err)
		}
	}
	// cached is the login service's record in Redis; stored is in the
	// database, with the node's copy in Redis, which is not a record.
	found, err := sessions.Presence(ctx, []string{cached, stored, expired})
	if err != nil || found[cached] != (auth.SessionPresence{Redis: true, DBChecked: true}) ||
		found[stored] != (auth.SessionPresence{DB: true, DBChecked: true}) || found[expired] != (auth.SessionPresence{DBChecked: true, Ended: true}) {
		t.Fatalf("presence %+v, %v", found, err)
	}
	r.Client.Del(ctx, r.Names.Prefix+"session:"+cached)
	if found, _ := sessions.Presence(ctx, []string{cached}); found[cached].Redis {
		t.Fatal("a deleted session is still in Redis")
	}
	// A revoked session is refused at once, whatever the database holds.
	if err := sessions.Revoke(ctx, stored); err != nil {
		t.Fatal(err)
	}
	if _, err := authn(stored); !errors.Is(err, auth.ErrInvalidToken) {
		t.Fatalf("a revoked session: %v, want ErrInvalidToken", err)
	}
	if got := r.Client.Get(ctx, r.Names.Prefix+"session:"+stored).Val(); got != `{"revoked":true}` {
		t.Fatalf("the tombstone is %s, want {\"revoked\":true} as documented", got)
	}
	if found, _ := sessions.Presence(ctx, []string{stored}); !found[stored].Ended {
		t.Fatalf("a revoked session's presence %+v, want Ended", found[stored])
	}
}

// A session carries its grant from either store: the projects of its
// Redis copy, or its row's projects column, which the write-back keeps.
// Without them it sees its user's own tasks only; a grant that is not one
// refuses the session.
func TestSessionsCarryTheirGrant(t *testing.T) {
	sessions, r, pg := sessionsOn(t, "pushd_auth_grants_"+testenv.RandomSuffix(4), session.Config{})
	ctx := context.Background()
	cached, stored, narrow, bad := "c_"+testenv.RandomSuffix(12), "s_"+testenv.RandomSuffix(12), "n_"+testenv.RandomSuffix(12), "b_"+testenv.RandomSuffix(12)
	r.Client.Set(ctx, r.Names.Prefix+"session:"+cached, `{"tenant_id":"t1","user_id":"u1","projects":["p2","p1"]}`, time.Hour)
	r.Client.Set(ctx, r.Names.Prefix+"session:"+bad, `{"tenant_id":"t1","user_id":"u1","projects":["p1","*"]}`, time.Hour)
	if _, err := pg.Pool.Exec(ctx, `INSERT INTO sessions (token, tenant_id, user_id, projects) VALUES
		($1, 't2', 'u2', '{*}'), ($2, 't2', 'u3', DEFAULT)`, stored, narrow); err != nil {
		t.Fatal(err)
	}
	if p, err := sessions.Resolve(ctx, cached); err != nil || p.Grant == nil || !slices.Equal(p.Grant.Projects, []string{"p1", "p2"}) {
		t.Fatalf("cached session: %+v, %v; want projects p1 and p2", p, err)
	}
	for range 2 { // from PostgreSQL, then from its copy in Redis
		if p, err := sessions.Resolve(ctx, stored); err != nil || p.Grant == nil || !p.Grant.All {
			t.Fatalf("stored session: %+v, %v; want every project", p, err)
		}
	}
	if p, err := sessions.Resolve(ctx, narrow); err != nil || p.Grant != nil {
		t.Fatalf("session without projects: %+v, %v; want its own tasks only", p, err)
	}
	if _, err := sessions.Resolve(ctx, bad); !errors.Is(err, auth.ErrInvalidToken) {
		t.Fatalf("session with a bad grant: %v, want ErrInvalidToken", err)
	}
}

func TestSessionsStoreDown(t *testing.T) {
	rs := testenv.StartRedis(t)
	rdb := redis.NewClient(&redis.Options{Addr: rs.Addr, MaxRetries: -1})
	t.Cleanup(func() { rdb.Close() })
	sessions := session.New(session.Config{Redis: rdb, Timeout: time.Second})
	rs.Stop()
	if _, err := sessions.Resolve(context.Background(), "s_"+testenv.RandomSuffix(12)); !errors.Is(err, auth.ErrUnavailable) || errors.Is(err, auth.ErrInvalidToken) {
		t.Fatalf("%v, want ErrUnavailable", err)
	}
	if _, err := sessions.Presence(context.Background(), []string{"s_" + testenv.RandomSuffix(12)}); err == nil {
		t.Fatal("Presence reported sessions with the store down")
	}
}

// sessionsOn returns Sessions over the shared Redis and a pool of its own
// on the package database, named app so FlushStats can find its backends.
// The pool's statistics are flushed when the test ends, so that they cannot
// turn up in a later test's count.
func sessionsOn(t testing.TB, app string, cfg session.Config) (*session.Store, testenv.Redis, testenv.Postgres) {
	t.Helper()
	r := testenv.SharedRedis(t)
	pg := testenv.Database(t)
	pool, err := pgxpool.New(context.Background(), pg.AppURL(app))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		pool.Close()
		pg.FlushStats(t, app)
	})
	cfg.Redis, cfg.DB, cfg.Prefix = r.Client, pool, r.Names.Prefix
	return session.New(cfg), r, pg
}

// An unknown session token is looked up in PostgreSQL once, however often
// it comes back within the negative TTL; Redis is still asked each time, so
// a session written there meanwhile is found.
func TestSessionsUnknownTokenCachedNegatively(t *testing.T) {
	app := "pushd_auth_neg_" + testenv.RandomSuffix(4)
	sessions, r, pg := sessionsOn(t, app, session.Config{NegativeTTL: time.Minute})
	ctx := context.Background()
	before := pg.TableScans(t, "sessions")
	tok := "unknown_" + testenv.RandomSuffix(12)
	const tries = 50
	for range tries {
		if _, err := sessions.Resolve(ctx, tok); !errors.Is(err, auth.ErrInvalidToken) {
			t.Fatalf("unknown token: %v, want ErrInvalidToken", err)
		}
	}
	pg.FlushStats(t, app)
	if lookups := pg.TableScans(t, "sessions") - before; lookups != 1 {
		t.Fatalf("%d tries of one unknown token made %d PostgreSQL lookups, want 1", tries, lookups)
	}
	r.Client.Set(ctx, r.Names.Prefix+"session:"+tok, `{"tenant_id":"t1","user_id":"u1"}`, time.Minute)
	if p, err := sessions.Resolve(ctx, tok); err != nil || p.UserID != "u1" {
		t.Fatalf("session written to Redis after a miss: %+v, %v", p, err)
	}
}

// Session lookups hold at most MaxDBQueries PostgreSQL queries at once;
// one that finds them all taken for DBQueueWait fails with ErrUnavailable
// instead of queueing behind them.
func TestSessionsLookupsBoundedInPostgres(t *testing.T) {
	app := "pushd_auth_bound_" + testenv.RandomSuffix(4)
	const bound, lookups = 2, 6
	sessions, _, pg := sessionsOn(t, app, session.Config{MaxDBQueries: bound, DBQueueWait: 100 * time.Millisecond, Timeout: time.Minute})
	ctx := context.Background()
	var wg sync.WaitGroup
	defer wg.Wait() // after the rollback below
	// A transaction holding the table makes every lookup wait in PostgreSQL.
	lock, err := pg.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Rollback(ctx)
	if _, err := lock.Exec(ctx, "LOCK TABLE sessions IN ACCESS EXCLUSIVE MODE"); err != nil {
		t.Fatal(err)
	}
	errs := make(chan error, lookups)
	for range lookups {
		wg.Go(func() {
			_, err := sessions.Resolve(ctx, "unknown_"+testenv.RandomSuffix(12))
			errs <- err
		})
	}
	var unavailable, waiting int
	deadline := time.Now().Add(10 * time.Second)
	for unavailable < lookups-bound || waiting != bound {
		if time.Now().After(deadline) {
			lock.Rollback(ctx)
			t.Fatalf("with the table locked: %d of %d lookups failed as unavailable and %d wait in PostgreSQL, want %d and %d",
				unavailable, lookups, waiting, lookups-bound, bound)
		}
		select {
		case err := <-errs:
			if !errors.Is(err, auth.ErrUnavailable) {
				t.Fatalf("a lookup beyond the bound: %v, want ErrUnavailable", err)
			}
			unavailable++
		case <-time.After(20 * time.Millisecond): // polling PostgreSQL, with a deadline
		}
		if err := pg.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE application_name = $1 AND wait_event_type = 'Lock'`, app).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
	}
	if err := lock.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	for range bound {
		if err := <-errs; !errors.Is(err, auth.ErrInvalidToken) {
			t.Fatalf("a lookup within the bound, once the table is free: %v, want ErrInvalidToken", err)
		}
	}
}

// BenchmarkRecheck10000Sessions is one re-check of 10,000 open sessions as
// a node runs it (batches of 500): the sessions live in PostgreSQL, with
// the node's copies in Redis. It reports the database queries per re-check
// (20: one per batch, whatever the sessions) and the time one takes.
func BenchmarkRecheck10000Sessions(b *testing.B) {
	const n, batch = 10000, 500
	sessions, r, pg := sessionsOn(b, "pushd_auth_recheck_"+testenv.RandomSuffix(4), session.Config{})
	ctx := context.Background()
	tokens := make([]string, n)
	for i := range tokens {
		tokens[i] = fmt.Sprintf("r_%s_%05d", testenv.RandomSuffix(6), i)
	}
	if _, err := pg.Pool.Exec(ctx, `INSERT INTO sessions (token, tenant_id, user_id, expires_at)
		SELECT t, 't1', 'u1', now() + interval '1 hour' FROM unnest($1::text[]) AS t`, tokens); err != nil {
		b.Fatal(err)
	}
	pipe := r.Client.Pipeline()
	for _, tok := range tokens {
		pipe.Set(ctx, r.Names.Prefix+"session:"+tok, `{"tenant_id":"t1","user_id":"u1","pushd_copy":true}`, time.Hour)
	}
	if _, err := pipe.Exec(ctx); err != nil {
		b.Fatal(err)
	}
	before := sessions.Queries()
	b.ResetTimer()
	for b.Loop() {
		for i := 0; i < n; i += batch {
			found, err := sessions.Presence(ctx, tokens[i:i+batch])
			if err != nil || !found[tokens[i]].DB {
				b.Fatalf("presence %+v, %v", found[tokens[i]], err)
			}
		}
	}
	b.ReportMetric(float64(sessions.Queries()-before)/float64(b.N), "queries/recheck")
}
