package auth_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/pushd/pushd/auth"
)

// TestReasonOf: every refusal carries the reason a tool explains it by,
// and the error's message states the same reason.
func TestReasonOf(t *testing.T) {
	now := time.Now()
	with := func(edit func(jwt.MapClaims)) jwt.MapClaims {
		c := goodClaims()
		edit(c)
		return c
	}
	strict := auth.Config{Secret: testSecret, Audience: []string{"pushd"}, Issuer: "https://login.example", MaxTTL: time.Hour}
	good := func(c jwt.MapClaims) { c["aud"] = "pushd"; c["iss"] = "https://login.example" }
	for _, tc := range []struct {
		name  string
		cfg   auth.Config
		token string
		want  auth.Reason
	}{
		{"too long", strict, strings.Repeat("a", auth.MaxTokenLen+1), auth.ReasonTooLong},
		{"malformed", strict, "a.b.c", auth.ReasonMalformed},
		{"another secret", strict, sign(t, jwt.SigningMethodHS256, []byte("another secret"), with(good)), auth.ReasonSignature},
		{"another algorithm", strict, sign(t, jwt.SigningMethodES256, ecKey().priv, with(good)), auth.ReasonAlgorithm},
		{"expired", strict, sign(t, jwt.SigningMethodHS256, testSecret, with(func(c jwt.MapClaims) {
			good(c)
			c["exp"], c["iat"] = now.Add(-time.Hour).Unix(), now.Add(-90*time.Minute).Unix()
		})), auth.ReasonExpired},
		{"no exp", strict, sign(t, jwt.SigningMethodHS256, testSecret, with(func(c jwt.MapClaims) { good(c); delete(c, "exp") })), auth.ReasonMissingClaim},
		{"no aud", strict, sign(t, jwt.SigningMethodHS256, testSecret, with(func(c jwt.MapClaims) { good(c); delete(c, "aud") })), auth.ReasonMissingClaim},
		{"other aud", strict, sign(t, jwt.SigningMethodHS256, testSecret, with(func(c jwt.MapClaims) { good(c); c["aud"] = "other" })), auth.ReasonAudience},
		{"other iss", strict, sign(t, jwt.SigningMethodHS256, testSecret, with(func(c jwt.MapClaims) { good(c); c["iss"] = "https://other.example" })), auth.ReasonIssuer},
		{"too long a lifetime", strict, sign(t, jwt.SigningMethodHS256, testSecret, with(func(c jwt.MapClaims) {
			good(c)
			c["exp"] = now.Add(2 * time.Hour).Unix()
		})), auth.ReasonLifetime},
		{"no sub", strict, sign(t, jwt.SigningMethodHS256, testSecret, with(func(c jwt.MapClaims) { good(c); delete(c, "sub") })), auth.ReasonSubject},
		{"projects not a grant", strict, sign(t, jwt.SigningMethodHS256, testSecret, with(func(c jwt.MapClaims) { good(c); c["projects"] = []string{"p1", "*"} })), auth.ReasonProjects},
		{"no tenant", strict, sign(t, jwt.SigningMethodHS256, testSecret, with(func(c jwt.MapClaims) { good(c); delete(c, "tenant_id") })), auth.ReasonTenant},
		{"not yet valid", strict, sign(t, jwt.SigningMethodHS256, testSecret, with(func(c jwt.MapClaims) { good(c); c["nbf"] = now.Add(time.Minute).Unix() })), auth.ReasonNotYetValid},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := newVerifier(t, tc.cfg).Verify(tc.token)
			got, ok := auth.ReasonOf(err)
			if !ok || got != tc.want {
				t.Fatalf("ReasonOf(%v) = %q, %v; want %q", err, got, ok, tc.want)
			}
			if tc.want != auth.ReasonExpired && !strings.HasSuffix(err.Error(), ": "+string(tc.want)) {
				t.Errorf("error %q does not state %q", err, tc.want)
			}
		})
	}
	if alg := newVerifier(t, strict).Algorithm(); alg != auth.AlgHS256 {
		t.Errorf("Algorithm() = %s, want HS256", alg)
	}
	if alg := newVerifier(t, auth.Config{PublicKeyPEM: ecKey().pem}).Algorithm(); alg != auth.AlgES256 {
		t.Errorf("Algorithm() = %s, want ES256", alg)
	}
	if _, ok := auth.ReasonOf(auth.ErrMissingToken); ok {
		t.Error("ReasonOf(ErrMissingToken) reports a reason")
	}
	if _, ok := auth.ReasonOf(errors.New("other")); ok {
		t.Error("ReasonOf(another error) reports a reason")
	}
}
