package auth

import (
	"crypto/rand"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/pushd/pushd/snapshot"
)

// Signer makes HS256 tokens that a Verifier with the same secret accepts.
// The embedded mode uses it to hand out demo tokens; tests use it too. It is
// safe for concurrent use.
type Signer struct {
	secret []byte
}

// NewSigner returns a Signer for secret, which it copies.
func NewSigner(secret []byte) *Signer {
	return &Signer{secret: slices.Clone(secret)}
}

// Sign returns a token for p, expiring at p.ExpiresAt (to the second) and
// issued now, with a plan claim when p.Plan is set. p's ids must pass snapshot.ValidID and p.ExpiresAt must be
// set.
func (s *Signer) Sign(p Principal) (string, error) {
	if len(s.secret) == 0 {
		return "", errors.New("auth: sign: empty secret")
	}
	if !snapshot.ValidID(p.TenantID) {
		return "", errors.New("auth: sign: invalid tenant id")
	}
	if !snapshot.ValidID(p.UserID) {
		return "", errors.New("auth: sign: invalid user id")
	}
	if p.ExpiresAt.IsZero() {
		return "", errors.New("auth: sign: no expiry")
	}
	if p.Plan != "" && !snapshot.ValidID(p.Plan) {
		return "", errors.New("auth: sign: invalid plan")
	}
	c := claims{
		TenantID: p.TenantID,
		Plan:     p.Plan,
		Projects: p.Grant.Claim(),
		RegisteredClaims: jwt.RegisteredClaims{
			Subject:   p.UserID,
			ExpiresAt: jwt.NewNumericDate(p.ExpiresAt),
			IssuedAt:  jwt.NewNumericDate(time.Now()),
		},
	}
	token, err := jwt.NewWithClaims(jwt.SigningMethodHS256, c).SignedString(s.secret)
	if err != nil {
		return "", fmt.Errorf("auth: sign: %w", err)
	}
	return token, nil
}

// RandomSecret returns 32 random bytes, a fresh HS256 secret.
func RandomSecret() []byte {
	b := make([]byte, 32)
	rand.Read(b) // never returns an error (crypto/rand, Go 1.24+)
	return b
}
