// Package httperr writes the JSON error bodies every pushd endpoint answers
// with: {"error":"<code>","message":"..."}, and, for a 429, how long to wait
// in the fields the platform's clients read.
package httperr

import (
	"encoding/json"
	"net/http"
	"strconv"
	"time"
)

// Codes shared by the endpoints.
const (
	BadRequest       = "bad_request"
	InvalidID        = "invalid_id"
	UnknownParameter = "unknown_parameter"
	TooMany          = "too_many_ids"
	Unauthorized     = "unauthorized"
	TokenExpired     = "token_expired"
	Forbidden        = "forbidden"
	NotFound         = "not_found"
	// RateLimitExceeded refuses a request for a rate limit (a token
	// bucket or a window); TooManyConnections for a cap on open
	// connections. Both come with a wait: see TooManyRequests.
	RateLimitExceeded  = "rate_limit_exceeded"
	TooManyConnections = "too_many_connections"
	Draining           = "draining"
	OverCapacity       = "over_capacity"
	URITooLong         = "uri_too_long"
	Unavailable        = "unavailable"
	Internal           = "internal"
	// HostNotAllowed refuses, on the admin and debug listeners, a request
	// whose Host is not one of the listener's own names (DNS rebinding).
	HostNotAllowed = "host_not_allowed"
)

// Body is the JSON error body.
type Body struct {
	Error   string `json:"error"`
	Message string `json:"message"`
}

// Write answers with status and a JSON error body.
func Write(w http.ResponseWriter, status int, code, message string) {
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Cache-Control", "no-store")
	h.Del("Content-Length")
	if status == http.StatusUnauthorized {
		h.Set("WWW-Authenticate", `Bearer realm="pushd"`)
	}
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(Body{Error: code, Message: message})
}

// RetryAfter sets Retry-After to d, rounded up to whole seconds (at least
// one).
func RetryAfter(w http.ResponseWriter, d time.Duration) {
	w.Header().Set("Retry-After", strconv.FormatInt(RetryAfterSeconds(RetryAfterMS(d)), 10))
}

// RetryAfterMS is a wait in whole milliseconds, rounded up and at least one,
// so a client told it never comes back early or at once: what
// retry_after_ms carries.
func RetryAfterMS(d time.Duration) int64 {
	return max(int64((d+time.Millisecond-1)/time.Millisecond), 1)
}

// RetryAfterSeconds is ms in whole seconds, rounded up: what Retry-After
// and retry_after carry. Derived from the milliseconds, never from the
// duration, so the two fields always agree:
// retry_after*1000 >= retry_after_ms > (retry_after-1)*1000.
func RetryAfterSeconds(ms int64) int64 { return (ms + 999) / 1000 }

// LimitBody is the error body of a 429: the JSON error of every endpoint
// plus the wait, in whole seconds (equal to Retry-After) and in
// milliseconds.
type LimitBody struct {
	Error        string `json:"error"`
	RetryAfter   int64  `json:"retry_after"`
	RetryAfterMS int64  `json:"retry_after_ms"`
	Message      string `json:"message"`
}

// NewLimitBody is the LimitBody of a refusal of code for wait.
func NewLimitBody(code string, wait time.Duration, message string) LimitBody {
	ms := RetryAfterMS(wait)
	return LimitBody{Error: code, RetryAfter: RetryAfterSeconds(ms), RetryAfterMS: ms, Message: message}
}

// TooManyRequests answers 429 with Retry-After and a LimitBody: every 429
// pushd answers is written here. code is RateLimitExceeded or
// TooManyConnections.
func TooManyRequests(w http.ResponseWriter, code string, wait time.Duration, message string) {
	body := NewLimitBody(code, wait, message)
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Cache-Control", "no-store")
	h.Del("Content-Length")
	h.Set("Retry-After", strconv.FormatInt(body.RetryAfter, 10))
	w.WriteHeader(http.StatusTooManyRequests)
	json.NewEncoder(w).Encode(body)
}

// Truncate shortens s to n bytes for an error message, marking the cut, so
// a hostile input is never echoed whole.
func Truncate(s string, n int) string {
	if len(s) > n {
		return s[:n] + "..."
	}
	return s
}
