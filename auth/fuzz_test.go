package auth_test

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/pushd/pushd/auth"
	"github.com/pushd/pushd/snapshot"
)

// fuzzSeeds are tokens to mutate: valid, expired, unsigned, signed with
// another key or algorithm, and broken.
func fuzzSeeds(f *testing.F) []string {
	f.Helper()
	s := auth.NewSigner(testSecret)
	valid, err := s.Sign(auth.Principal{TenantID: "t1", UserID: "u1", ExpiresAt: time.Now().Add(24 * time.Hour)})
	if err != nil {
		f.Fatal(err)
	}
	expired, _ := s.Sign(auth.Principal{TenantID: "t1", UserID: "u1", ExpiresAt: time.Now().Add(-time.Hour)})
	other, _ := auth.NewSigner([]byte("another-secret-0123456789abcdef!")).Sign(auth.Principal{TenantID: "t2", UserID: "u2", ExpiresAt: time.Now().Add(time.Hour)})
	parts := strings.Split(valid, ".")
	none := base64.RawURLEncoding.EncodeToString([]byte(`{"alg":"none","typ":"JWT"}`)) + "." + parts[1] + "."
	return []string{valid, expired, other, none, parts[0] + "." + parts[1], valid + ".x", "", "a.b.c", strings.Repeat("A", 9000)}
}

// checkForged fails when Verify accepted a token that the test secret did
// not sign with HS256 over exactly its header and payload.
func checkForged(t *testing.T, tok string, p auth.Principal) {
	t.Helper()
	parts := strings.Split(tok, ".")
	if len(parts) != 3 {
		t.Fatalf("accepted %q: not three parts", tok)
	}
	sig, err := base64.RawURLEncoding.DecodeString(parts[2])
	if err != nil {
		t.Fatalf("accepted %q: signature is not base64url: %v", tok, err)
	}
	mac := hmac.New(sha256.New, testSecret)
	mac.Write([]byte(parts[0] + "." + parts[1]))
	if !bytes.Equal(sig, mac.Sum(nil)) {
		t.Fatalf("accepted %q, which the secret did not sign", tok)
	}
	if !snapshot.ValidID(p.TenantID) || !snapshot.ValidID(p.UserID) || !p.ExpiresAt.After(time.Now().Add(-time.Minute)) {
		t.Fatalf("accepted %q as %+v", tok, p)
	}
}

// FuzzVerify feeds client tokens to an HS256 verifier. Whatever it accepts
// was signed by the secret and names a valid tenant and user, unexpired.
func FuzzVerify(f *testing.F) {
	for _, s := range fuzzSeeds(f) {
		f.Add(s)
	}
	v, err := auth.New(auth.Config{Secret: testSecret})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, tok string) {
		p, err := v.Verify(tok)
		if err != nil {
			if len(err.Error()) > 200 {
				t.Fatalf("error message of %d bytes: it may echo the token", len(err.Error()))
			}
			return
		}
		checkForged(t, tok, p)
	})
}

// FuzzAuthenticate feeds the places a request carries its token: the
// Authorization header, the pushd_token cookie and the access_token query
// parameter, in any combination.
func FuzzAuthenticate(f *testing.F) {
	for _, s := range fuzzSeeds(f) {
		f.Add("Bearer "+s, "", "")
		f.Add("", s, "")
		f.Add("", "", s)
		f.Add("bearer "+s, s, "x")
		f.Add("BeArEr "+s, "", "") // the scheme is case-insensitive
	}
	v, err := auth.New(auth.Config{Secret: testSecret})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, header, cookie, query string) {
		r, err := http.NewRequest(http.MethodGet, "http://pushd/v1/events?access_token="+url.QueryEscape(query), nil)
		if err != nil {
			t.Fatal(err)
		}
		if header != "" {
			r.Header["Authorization"] = []string{header}
		}
		if cookie != "" {
			r.Header["Cookie"] = []string{"pushd_token=" + cookie}
		}
		p, err := v.Authenticate(r)
		if err != nil {
			return
		}
		// Whichever place it came from, the accepted token is one of the
		// three. The header's scheme is "Bearer " in any case.
		fromHeader := ""
		if len(header) >= len("Bearer ") && strings.EqualFold(header[:len("Bearer ")], "Bearer ") {
			fromHeader = strings.TrimSpace(header[len("Bearer "):])
		}
		for _, tok := range []string{fromHeader, cookie, query} {
			if q, err := v.Verify(tok); err == nil && q == p {
				checkForged(t, tok, p)
				return
			}
		}
		t.Fatalf("authenticated as %+v from header %q, cookie %q, query %q, none of which verifies alone", p, header, cookie, query)
	})
}
