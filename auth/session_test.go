package auth_test

import (
	"context"
	"errors"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pushd/pushd/auth"
	"github.com/pushd/pushd/testenv"
)

func TestIsSessionToken(t *testing.T) {
	tok, err := auth.NewSigner(testSecret).Sign(auth.Principal{TenantID: "t1", UserID: "u1", ExpiresAt: time.Now().Add(time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	if auth.IsSessionToken(tok) {
		t.Fatal("a JWT taken for a session token")
	}
	if !auth.IsSessionToken("sess_0123456789abcdef") || !auth.IsSessionToken("a.b") {
		t.Fatal("a token without two dots is a session token")
	}
}

func TestPlanClaimRoundTrip(t *testing.T) {
	v, err := auth.New(auth.Config{Secret: testSecret})
	if err != nil {
		t.Fatal(err)
	}
	s := auth.NewSigner(testSecret)
	tok, err := s.Sign(auth.Principal{TenantID: "t1", UserID: "u1", Plan: "pro", ExpiresAt: time.Now().Add(time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	if p, err := v.Verify(tok); err != nil || p.Plan != "pro" {
		t.Fatalf("plan %q, err %v", p.Plan, err)
	}
	if _, err := s.Sign(auth.Principal{TenantID: "t1", UserID: "u1", Plan: "a plan", ExpiresAt: time.Now().Add(time.Hour)}); err == nil {
		t.Fatal("signed an invalid plan")
	}
}

func TestSessionsRedisThenPostgres(t *testing.T) {
	r := testenv.SharedRedis(t)
	pg := testenv.Database(t)
	ctx := context.Background()
	sessions := auth.NewSessions(auth.SessionsConfig{Redis: r.Client, DB: pg.Pool, Prefix: r.Names.Prefix})
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
	if ttl := r.Client.TTL(ctx, r.Names.Prefix+"session:"+stored).Val(); ttl <= 0 || ttl > 10*time.Minute {
		t.Fatalf("written back with TTL %s, want up to its expiry", ttl)
	}
	for _, tok := range []string{expired, "unknown_" + testenv.RandomSuffix(8), "bad-token!-0123456789"} {
		if _, err := authn(tok); !errors.Is(err, auth.ErrInvalidToken) {
			t.Fatalf("%q: %v, want ErrInvalidToken", tok, err)
		}
	}
	valid, err := sessions.Valid(ctx, []string{cached, stored, expired})
	if err != nil || !valid[cached] || !valid[stored] || valid[expired] {
		t.Fatalf("valid %v, %v", valid, err)
	}
	r.Client.Del(ctx, r.Names.Prefix+"session:"+cached)
	if valid, _ := sessions.Valid(ctx, []string{cached}); valid[cached] {
		t.Fatal("a deleted session is still valid")
	}
}

func TestSessionsStoreDown(t *testing.T) {
	rs := testenv.StartRedis(t)
	rdb := redis.NewClient(&redis.Options{Addr: rs.Addr, MaxRetries: -1})
	t.Cleanup(func() { rdb.Close() })
	sessions := auth.NewSessions(auth.SessionsConfig{Redis: rdb, Timeout: time.Second})
	rs.Stop()
	if _, err := sessions.Resolve(context.Background(), "s_"+testenv.RandomSuffix(12)); !errors.Is(err, auth.ErrUnavailable) || errors.Is(err, auth.ErrInvalidToken) {
		t.Fatalf("%v, want ErrUnavailable", err)
	}
	if _, err := sessions.Valid(context.Background(), []string{"s_" + testenv.RandomSuffix(12)}); err == nil {
		t.Fatal("Valid reported sessions with the store down")
	}
}
