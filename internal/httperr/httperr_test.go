package httperr

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"
)

// Every 429 carries its wait twice, and the two agree: Retry-After equals
// the body's retry_after, the milliseconds rounded up to whole seconds
// (at least one), and retry_after_ms is the wait rounded up to a whole
// millisecond (at least one), so a client never comes back early.
func TestTooManyRequestsAgreesWithRetryAfter(t *testing.T) {
	for _, tc := range []struct {
		wait     time.Duration
		secs, ms int64
	}{
		{0, 1, 1},
		{-time.Second, 1, 1},
		{time.Nanosecond, 1, 1},
		{time.Millisecond, 1, 1},
		{999 * time.Millisecond, 1, 999},
		{999*time.Millisecond + 1, 1, 1000},
		{time.Second, 1, 1000},
		{time.Second + time.Nanosecond, 2, 1001},
		{29*time.Second + 1, 30, 29001},
		{30 * time.Second, 30, 30000},
		{time.Hour, 3600, 3600000},
	} {
		w := httptest.NewRecorder()
		TooManyRequests(w, RateLimitExceeded, tc.wait, "slow down")
		var b LimitBody
		if err := json.Unmarshal(w.Body.Bytes(), &b); err != nil {
			t.Fatal(err)
		}
		h := w.Result().Header
		if w.Code != http.StatusTooManyRequests || b.Error != RateLimitExceeded || b.Message != "slow down" ||
			h.Get("Content-Type") != "application/json" || h.Get("Cache-Control") != "no-store" {
			t.Errorf("%v: %d %v %s", tc.wait, w.Code, h, w.Body)
		}
		if b.RetryAfter != tc.secs || b.RetryAfterMS != tc.ms || h.Get("Retry-After") != strconv.FormatInt(tc.secs, 10) {
			t.Errorf("%v: Retry-After %q, retry_after %d, retry_after_ms %d; want %d, %d, %d",
				tc.wait, h.Get("Retry-After"), b.RetryAfter, b.RetryAfterMS, tc.secs, tc.secs, tc.ms)
		}
		// RetryAfter alone (a 503's) says the same.
		w = httptest.NewRecorder()
		RetryAfter(w, tc.wait)
		if got := w.Result().Header.Get("Retry-After"); got != strconv.FormatInt(tc.secs, 10) {
			t.Errorf("%v: RetryAfter set %q, want %d", tc.wait, got, tc.secs)
		}
	}
}

// Every wait a millisecond count can carry rounds to seconds within the
// bounds the platform's clients rely on.
func TestRetryAfterSecondsBounds(t *testing.T) {
	for ms := int64(1); ms <= 5000; ms++ {
		if s := RetryAfterSeconds(ms); s*1000 < ms || ms <= (s-1)*1000 {
			t.Fatalf("%d ms: %d s", ms, s)
		}
	}
}
