package api_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// reply is an answer read whole.
type reply struct {
	status int
	header http.Header
	body   []byte
}

// req is a request to make; header values are set, not added.
type req struct {
	method, path string
	header       map[string]string
	body         string
}

// do sends r to the server at base over HTTP and reads the answer.
func do(t *testing.T, base string, r req) reply {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var body io.Reader = http.NoBody
	if r.body != "" {
		body = strings.NewReader(r.body)
	}
	hr, err := http.NewRequestWithContext(ctx, r.method, base+r.path, body)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range r.header {
		hr.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(hr)
	if err != nil {
		t.Fatalf("%s %s: %v", r.method, r.path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: reading the body: %v", r.method, r.path, err)
	}
	return reply{status: resp.StatusCode, header: resp.Header, body: b}
}

// serveFrom runs r through h as if it came from the TCP peer remote
// ("ip:port"), which a test server on loopback cannot otherwise fake.
func serveFrom(h http.Handler, remote string, r req) reply {
	hr := httptest.NewRequest(r.method, r.path, strings.NewReader(r.body))
	hr.RemoteAddr = remote
	for k, v := range r.header {
		hr.Header.Set(k, v)
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, hr)
	return reply{status: w.Code, header: w.Header(), body: w.Body.Bytes()}
}

// errorBody decodes a JSON error body; ok is false when it is not one.
func (r reply) errorBody() (code, message string, ok bool) {
	var b struct {
		Error   *string `json:"error"`
		Message string  `json:"message"`
	}
	if err := json.Unmarshal(r.body, &b); err != nil || b.Error == nil {
		return "", "", false
	}
	return *b.Error, b.Message, true
}

// wantError fails unless r is status with a JSON error body of code and a
// message, served as application/json.
func wantError(t *testing.T, what string, r reply, status int, code string) {
	t.Helper()
	got, msg, ok := r.errorBody()
	switch {
	case r.status != status || !ok || got != code || msg == "":
		t.Errorf("%s: %d %q; want %d with error %q and a message", what, r.status, r.body, status, code)
	case !strings.HasPrefix(r.header.Get("Content-Type"), "application/json"):
		t.Errorf("%s: Content-Type %q, want application/json", what, r.header.Get("Content-Type"))
	}
}
