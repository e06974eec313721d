package auth_test

import (
	"testing"
	"time"

	"github.com/pushd/pushd/auth"
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
