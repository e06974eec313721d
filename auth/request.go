package auth

import (
	"context"
	"errors"
	"net/http"
	"strings"
)

// SessionResolver resolves an opaque session token to the principal it
// names (auth/session's Store is the one a node uses). Resolve returns an
// error wrapping ErrInvalidToken (see Invalid) for an unknown, expired or
// malformed token, and one wrapping ErrUnavailable when it could not tell.
type SessionResolver interface {
	Resolve(ctx context.Context, token string) (Principal, error)
}

// SessionPresence is what one re-validation found of a session.
type SessionPresence struct {
	// Redis: a record the login service wrote (not a node's copy of a
	// database row) is in Redis, unexpired.
	Redis bool
	// DB: the database has the row, unexpired. DBChecked says the
	// database was asked: false without one, or when it did not answer.
	DB, DBChecked bool
	// Ended: a store says the session ended: it expired there, or a node
	// revoked it.
	Ended bool
}

// ErrUnavailable means a session token could not be checked because
// neither the session cache nor the database answered. It does not match
// ErrInvalidToken: the client should retry, not log in again.
var ErrUnavailable = errors.New("auth: session store unavailable")

// IsSessionToken reports whether token is an opaque session token rather
// than a JWT: a JWT (JWS compact form) has exactly two dots, a session
// token none.
func IsSessionToken(token string) bool { return strings.Count(token, ".") != 2 }

// Authenticate finds the token r carries (see TokenFromRequest) and
// verifies it: a JWT with Verify, a session token (no two dots) through
// the configured Sessions. It returns ErrMissingToken when r carries none.
func (v *Verifier) Authenticate(r *http.Request) (Principal, error) {
	return v.AuthenticateToken(r.Context(), TokenFromRequest(r, v.cookieName))
}

// AuthenticateToken verifies token as Authenticate verifies the one a
// request carries: a token a client sends on an open connection (a
// WebSocket refresh) is checked exactly like the first.
func (v *Verifier) AuthenticateToken(ctx context.Context, token string) (Principal, error) {
	if token == "" {
		return Principal{}, ErrMissingToken
	}
	if v.sessions != nil && IsSessionToken(token) {
		return v.sessions.Resolve(ctx, token)
	}
	return v.Verify(token)
}

// TokenFromRequest returns the token r carries, looking in this order at an
// "Authorization: Bearer" header, the cookie cookieName (DefaultCookieName
// when empty) and the access_token query parameter, which is how an
// EventSource, unable to set headers, sends it. The first non-empty one
// wins; it returns "" when there is none. An Authorization header with
// another scheme is ignored.
func TokenFromRequest(r *http.Request, cookieName string) string {
	if t := bearer(r.Header.Get("Authorization")); t != "" {
		return t
	}
	if cookieName == "" {
		cookieName = DefaultCookieName
	}
	if c, err := r.Cookie(cookieName); err == nil && c.Value != "" {
		return c.Value
	}
	if r.URL != nil {
		return r.URL.Query().Get("access_token")
	}
	return ""
}

// bearer returns the credentials of a "Bearer" Authorization header value;
// the scheme is case-insensitive (RFC 9110, section 11.1).
func bearer(h string) string {
	const scheme = "Bearer "
	if len(h) < len(scheme) || !strings.EqualFold(h[:len(scheme)], scheme) {
		return ""
	}
	return strings.TrimSpace(h[len(scheme):])
}

// CookieName is the cookie Authenticate reads a token from.
func (v *Verifier) CookieName() string { return v.cookieName }

// Algorithm is the signing algorithm v pins: AlgHS256, AlgRS256, AlgES256
// or AlgEdDSA.
func (v *Verifier) Algorithm() string { return v.alg }
