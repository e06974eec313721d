package web_test

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/pushd/pushd/internal/testenv"
	"github.com/pushd/pushd/node"
)

func do(t *testing.T, method, u, token, body string) (*http.Response, string) {
	t.Helper()
	req, _ := http.NewRequest(method, u, strings.NewReader(body))
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}

func wantError(t *testing.T, resp *http.Response, body string, status int, code string) {
	t.Helper()
	var e struct{ Error, Message string }
	if resp.StatusCode != status || json.Unmarshal([]byte(body), &e) != nil || e.Error != code || e.Message == "" {
		t.Fatalf("got %d %s, want %d with JSON error %q", resp.StatusCode, body, status, code)
	}
}

func TestClientAndPageAreServed(t *testing.T) {
	n := startNode(t, node.Config{})
	for path, ctype := range map[string]string{
		"/client/pushd.js":             "text/javascript",
		"/client/pushd.d.ts":           "application/typescript",
		"/demo/":                       "text/html",
		"/demo/app.js":                 "text/javascript",
		"/demo/style.css":              "text/css",
		"/demo/assets/asset_vid_1.svg": "image/svg+xml",
	} {
		resp, body := do(t, http.MethodGet, n.URL+path, "", "")
		if resp.StatusCode != http.StatusOK || !strings.HasPrefix(resp.Header.Get("Content-Type"), ctype) || body == "" {
			t.Errorf("GET %s: %d %q", path, resp.StatusCode, resp.Header.Get("Content-Type"))
		}
	}
	for _, path := range []string{"/client/", "/client/nope.js", "/demo/nope.css", "/demo/assets/bad%20id.svg"} {
		resp, body := do(t, http.MethodGet, n.URL+path, "", "")
		wantError(t, resp, body, http.StatusNotFound, "not_found")
	}
	resp, _ := do(t, http.MethodGet, n.URL+"/demo", "", "")
	if resp.Request.URL.Path != "/demo/" {
		t.Errorf("/demo ended at %s, want a redirect to /demo/", resp.Request.URL.Path)
	}

	// The client loads from every origin and is revalidated cheaply; the
	// demo's files are the node's own page's.
	resp, _ = do(t, http.MethodGet, n.URL+"/client/pushd.js", "", "")
	etag := resp.Header.Get("ETag")
	if resp.Header.Get("Access-Control-Allow-Origin") != "*" || resp.Header.Get("Cross-Origin-Resource-Policy") != "cross-origin" ||
		!strings.HasPrefix(etag, `"`) || resp.Header.Get("Cache-Control") != "no-cache" {
		t.Errorf("/client/pushd.js headers %v: want any origin, cross-origin resource policy, an ETag and no-cache", resp.Header)
	}
	req, _ := http.NewRequest(http.MethodGet, n.URL+"/client/pushd.js", nil)
	req.Header.Set("If-None-Match", etag)
	if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode != http.StatusNotModified {
		t.Errorf("revalidating the client: %v %v, want 304", resp, err)
	} else {
		resp.Body.Close()
	}
	if resp, _ := do(t, http.MethodGet, n.URL+"/demo/app.js", "", ""); resp.Header.Get("Access-Control-Allow-Origin") != "" || resp.Header.Get("ETag") == "" {
		t.Errorf("/demo/app.js headers %v: want an ETag and no CORS", resp.Header)
	}
}

func TestStartTaskEndpoint(t *testing.T) {
	n := startNode(t, node.Config{})
	tok := demoToken(t, n.URL, "t1", "u1")
	u := n.URL + "/demo/tasks"

	resp, body := do(t, http.MethodPost, u, tok, `{"project_id":"p1","kind":"image_to_video","prompt":"x"}`)
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("start: %d %s", resp.StatusCode, body)
	}
	var got struct {
		Task struct{ TaskID, TenantID, UserID, ProjectID, Status, Provider string }
	}
	if err := json.Unmarshal([]byte(strings.NewReplacer("task_id", "taskid", "tenant_id", "tenantid", "user_id", "userid", "project_id", "projectid").Replace(body)), &got); err != nil {
		t.Fatal(err)
	}
	if tk := got.Task; tk.TenantID != "t1" || tk.UserID != "u1" || tk.ProjectID != "p1" || tk.Status != "QUEUED" || tk.Provider != "kling" {
		t.Fatalf("started %s", body)
	}

	resp, body = do(t, http.MethodPost, u, "", `{"project_id":"p1"}`)
	wantError(t, resp, body, http.StatusUnauthorized, "unauthorized")
	resp, body = do(t, http.MethodPost, u, "not-a-token", `{"project_id":"p1"}`)
	wantError(t, resp, body, http.StatusUnauthorized, "unauthorized")
	resp, body = do(t, http.MethodPost, u, tok, `{"project_id":"p 1"}`)
	wantError(t, resp, body, http.StatusBadRequest, "invalid_id")
	resp, body = do(t, http.MethodPost, u, tok, `{"project_id":"p1","kind":"audio"}`)
	wantError(t, resp, body, http.StatusBadRequest, "bad_request")
	resp, body = do(t, http.MethodPost, u, tok, `{"project_id":"p1","tenant_id":"other"}`)
	wantError(t, resp, body, http.StatusBadRequest, "bad_request")
	resp, body = do(t, http.MethodGet, u, tok, "")
	wantError(t, resp, body, http.StatusMethodNotAllowed, "method_not_allowed")

	// A tenant may run 12 at once: the 13th is refused with Retry-After.
	for range 11 {
		if resp, body := do(t, http.MethodPost, u, tok, `{"project_id":"p1"}`); resp.StatusCode != http.StatusCreated {
			t.Fatalf("start: %d %s", resp.StatusCode, body)
		}
	}
	resp, body = do(t, http.MethodPost, u, tok, `{"project_id":"p1"}`)
	wantError(t, resp, body, http.StatusTooManyRequests, "rate_limit_exceeded")
	var wait struct {
		RetryAfter   int64 `json:"retry_after"`
		RetryAfterMS int64 `json:"retry_after_ms"`
	}
	json.Unmarshal([]byte(body), &wait)
	if resp.Header.Get("Retry-After") != "2" || wait.RetryAfter != 2 || wait.RetryAfterMS != 2000 {
		t.Errorf("429 with Retry-After %q and %s, want 2 s in both", resp.Header.Get("Retry-After"), body)
	}
}

// With --demo on a node that has a secret, the page and the simulator are
// served but no token is handed out: a start needs a token of the node's
// own, and the task lands in that token's tenant.
func TestDemoOnConfiguredNodeServesNoTokens(t *testing.T) {
	redis := testenv.SharedRedis(t)
	n := startNode(t, node.Config{RedisURL: redis.URL, KeyPrefix: redis.Names.Prefix, JWTSecret: testSecret, Demo: true})
	resp, body := do(t, http.MethodGet, n.URL+"/demo/token?tenant=t1&user=u1", "", "")
	wantError(t, resp, body, http.StatusNotFound, "not_found")
	if resp, _ := do(t, http.MethodGet, n.URL+"/demo/", "", ""); resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /demo/: %d", resp.StatusCode)
	}
	if resp, body := do(t, http.MethodPost, n.URL+"/demo/tasks", signedToken(t, "t9", "u9"), `{"project_id":"p1"}`); resp.StatusCode != http.StatusCreated || !strings.Contains(body, `"tenant_id":"t9"`) {
		t.Fatalf("start with the node's token: %d %s", resp.StatusCode, body)
	}

	plain := startNode(t, node.Config{RedisURL: redis.URL, KeyPrefix: redis.Names.Prefix, JWTSecret: testSecret})
	resp, body = do(t, http.MethodGet, plain.URL+"/demo/", "", "")
	wantError(t, resp, body, http.StatusNotFound, "not_found")
	if resp, _ := do(t, http.MethodGet, plain.URL+"/client/pushd.js", "", ""); resp.StatusCode != http.StatusOK {
		t.Fatalf("the client is not served without --demo: %d", resp.StatusCode)
	}
}

// GET /demo/config tells the page whether the node hands out demo tokens,
// and GET /demo/me whom a token names, as the node verified it.
func TestDemoConfigAndIdentity(t *testing.T) {
	redis := testenv.SharedRedis(t)
	for _, tc := range []struct {
		name   string
		cfg    node.Config
		tokens bool
	}{
		{"embedded", node.Config{}, true},
		{"embedded-with-secret", node.Config{JWTSecret: testSecret}, false},
		{"redis", node.Config{RedisURL: redis.URL, KeyPrefix: redis.Names.Prefix, JWTSecret: testSecret, Demo: true}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := startNode(t, tc.cfg)
			resp, body := do(t, http.MethodGet, n.URL+"/demo/config", "", "")
			var cfg struct{ Tokens *bool }
			if resp.StatusCode != http.StatusOK || json.Unmarshal([]byte(body), &cfg) != nil || cfg.Tokens == nil || *cfg.Tokens != tc.tokens {
				t.Fatalf("GET /demo/config: %d %s, want tokens %v", resp.StatusCode, body, tc.tokens)
			}
			token := signedToken(t, "t1", "u1")
			if tc.tokens {
				token = demoToken(t, n.URL, "t1", "u1")
			}
			resp, body = do(t, http.MethodGet, n.URL+"/demo/me", token, "")
			if resp.StatusCode != http.StatusOK || strings.TrimSpace(body) != `{"tenant_id":"t1","user_id":"u1"}` ||
				resp.Header.Get("Cache-Control") != "no-store" {
				t.Fatalf("GET /demo/me: %d %s", resp.StatusCode, body)
			}
			resp, body = do(t, http.MethodGet, n.URL+"/demo/me", "", "")
			wantError(t, resp, body, http.StatusUnauthorized, "unauthorized")
			resp, body = do(t, http.MethodGet, n.URL+"/demo/me", "not-a-token", "")
			wantError(t, resp, body, http.StatusUnauthorized, "unauthorized")
		})
	}
}
