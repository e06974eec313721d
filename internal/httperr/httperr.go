// Package httperr writes the JSON error bodies every pushd endpoint answers
// with: {"error":"<code>","message":"..."}.
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
	RateLimited      = "rate_limited"
	Draining         = "draining"
	OverCapacity     = "over_capacity"
	URITooLong       = "uri_too_long"
	Unavailable      = "unavailable"
	Internal         = "internal"
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

// RetryAfter sets Retry-After to d, rounded up to whole seconds.
func RetryAfter(w http.ResponseWriter, d time.Duration) {
	w.Header().Set("Retry-After", strconv.Itoa(int((d+time.Second-1)/time.Second)))
}

// Truncate shortens s to n bytes for an error message, marking the cut, so
// a hostile input is never echoed whole.
func Truncate(s string, n int) string {
	if len(s) > n {
		return s[:n] + "..."
	}
	return s
}
