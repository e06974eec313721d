// Package auth verifies client tokens and says which tenant and user a
// connection belongs to.
//
// A token is a JWT whose "sub" claim names the user, whose "tenant_id" claim
// names the tenant and whose "exp" claim is required. The Verifier pins one
// signing algorithm, chosen by the configured key, so "alg: none" and
// algorithm-confusion tokens are refused before any key is used. Optionally
// the "aud" and "iss" claims must match the configuration, and a token may
// claim no longer a lifetime than a configured maximum.
//
// Opaque session tokens are resolved by a SessionResolver the Verifier is
// given (auth/session's Store on a node), so verifying JWTs links no
// Redis or PostgreSQL driver.
package auth

import (
	"errors"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/pushd/pushd/snapshot"
)

// Errors callers branch on. Every error Verify and Authenticate return wraps
// exactly one of them; none of their messages repeats the token.
var (
	// ErrMissingToken means the request carried no token at all.
	ErrMissingToken = errors.New("auth: missing token")
	// ErrInvalidToken means the token was refused: malformed, oversized,
	// signed with another key or algorithm, or with bad claims.
	ErrInvalidToken = errors.New("auth: invalid token")
	// ErrTokenExpired means a correctly signed token is past its exp claim
	// (plus the leeway). It does not match ErrInvalidToken.
	ErrTokenExpired = errors.New("auth: token expired")
)

// Signing algorithms a Verifier can pin.
const (
	AlgHS256 = "HS256"
	AlgRS256 = "RS256"
	AlgES256 = "ES256"
	AlgEdDSA = "EdDSA"
)

// DefaultCookieName is the cookie that carries a token when
// Config.CookieName is empty.
const DefaultCookieName = "pushd_token"

// MaxTokenLen bounds the length of a token; a longer one is refused with
// ErrInvalidToken before it is decoded.
const MaxTokenLen = 8 << 10

const defaultLeeway = 5 * time.Second

// Principal is who a verified token speaks for.
type Principal struct {
	TenantID  string
	UserID    string
	ExpiresAt time.Time
	// EndsAt is when this node stops honouring the token, and so ends its
	// connections: a JWT's exp plus the clock leeway its admission allowed,
	// a session's expires_at. Zero means never.
	EndsAt time.Time
	// Plan is the tenant's plan as the token states it (claim "plan", or the
	// session's plan); empty means the token says nothing and the tenant's
	// configured plan applies.
	Plan string
	// Session is the opaque session token the request authenticated with;
	// empty for a JWT.
	Session string
	// Grant is what the principal may see inside its tenant besides its
	// own tasks (claim "projects", or the session's projects); nil means
	// its own tasks only.
	Grant *snapshot.Grant
}

// claims is the token body pushd reads and the Signer writes.
type claims struct {
	TenantID string   `json:"tenant_id"`
	Plan     string   `json:"plan,omitempty"`
	Projects []string `json:"projects,omitempty"`
	jwt.RegisteredClaims
}
