package auth_test

import (
	"bytes"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/pushd/pushd/auth"
	"github.com/pushd/pushd/snapshot"
)

func TestSignerRoundTrip(t *testing.T) {
	secret := auth.RandomSecret()
	v := newVerifier(t, auth.Config{Secret: secret})
	exp := time.Now().Add(time.Hour)
	token, err := auth.NewSigner(secret).Sign(auth.Principal{TenantID: "t1", UserID: "u1", ExpiresAt: exp})
	if err != nil {
		t.Fatalf("Sign: %v", err)
	}

	// The header says HS256 and the claims are the ones documented.
	parsed, _, err := jwt.NewParser().ParseUnverified(token, jwt.MapClaims{})
	if err != nil {
		t.Fatal(err)
	}
	if alg := parsed.Header["alg"]; alg != "HS256" {
		t.Errorf("alg = %v, want HS256", alg)
	}
	c := parsed.Claims.(jwt.MapClaims)
	if c["sub"] != "u1" || c["tenant_id"] != "t1" || c["exp"] != float64(exp.Unix()) {
		t.Errorf("claims = %v", c)
	}

	p, err := v.Verify(token)
	if err != nil {
		t.Fatalf("Verify: %v", err)
	}
	if p.TenantID != "t1" || p.UserID != "u1" || !p.ExpiresAt.Equal(exp.Truncate(time.Second)) {
		t.Errorf("Verify = %+v", p)
	}

	// Another secret's verifier refuses it.
	if _, err := hsVerifier(t).Verify(token); err == nil {
		t.Error("a verifier with another secret accepted the token")
	}
}

// The projects claim round-trips: none, a list, every project.
func TestSignerGrantRoundTrip(t *testing.T) {
	secret := auth.RandomSecret()
	v := newVerifier(t, auth.Config{Secret: secret})
	for _, projects := range [][]string{nil, {"p2", "p1"}, {"*"}} {
		grant, err := snapshot.ParseGrant(projects)
		if err != nil {
			t.Fatal(err)
		}
		token, err := auth.NewSigner(secret).Sign(auth.Principal{TenantID: "t1", UserID: "u1", ExpiresAt: time.Now().Add(time.Hour), Grant: grant})
		if err != nil {
			t.Fatal(err)
		}
		p, err := v.Verify(token)
		if err != nil || !reflect.DeepEqual(p.Grant, grant) {
			t.Fatalf("projects %v: Verify = %+v, %v; want grant %+v", projects, p.Grant, err, grant)
		}
	}
}

func TestSignerRefuses(t *testing.T) {
	exp := time.Now().Add(time.Hour)
	s := auth.NewSigner(testSecret)
	for name, p := range map[string]auth.Principal{
		"no tenant":       {UserID: "u1", ExpiresAt: exp},
		"no user":         {TenantID: "t1", ExpiresAt: exp},
		"bad tenant":      {TenantID: "t{1}", UserID: "u1", ExpiresAt: exp},
		"bad user":        {TenantID: "t1", UserID: strings.Repeat("u", 200), ExpiresAt: exp},
		"no expiry":       {TenantID: "t1", UserID: "u1"},
		"everything zero": {},
	} {
		if tok, err := s.Sign(p); err == nil {
			t.Errorf("%s: Sign = %q, want an error", name, tok)
		}
	}
	if _, err := auth.NewSigner(nil).Sign(auth.Principal{TenantID: "t1", UserID: "u1", ExpiresAt: exp}); err == nil {
		t.Error("Sign with an empty secret succeeded")
	}
}

func TestRandomSecret(t *testing.T) {
	a, b := auth.RandomSecret(), auth.RandomSecret()
	if len(a) != 32 || len(b) != 32 {
		t.Fatalf("lengths %d, %d, want 32", len(a), len(b))
	}
	if bytes.Equal(a, b) {
		t.Fatal("two random secrets are equal")
	}
}
