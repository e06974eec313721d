package node_test

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/pushd/pushd/node"
)

// readyBody is the /readyz answer.
type readyBody struct {
	Status  string         `json:"status"`
	Reason  string         `json:"reason"`
	Checks  map[string]any `json:"checks"`
	Error   string         `json:"error"`
	Message string         `json:"message"`
}

// readyz asks /readyz and checks the status code and the body's status.
func readyz(t *testing.T, base string, wantCode int) readyBody {
	t.Helper()
	resp, body := httpDo(t, http.MethodGet, base+"/readyz", "", "")
	var rb readyBody
	if err := json.Unmarshal(body, &rb); err != nil {
		t.Fatalf("/readyz %d: %v: %s", resp.StatusCode, err, body)
	}
	wantStatus := "ready"
	if wantCode != http.StatusOK {
		wantStatus = "not_ready"
	}
	if resp.StatusCode != wantCode || rb.Status != wantStatus {
		t.Fatalf("/readyz %d %s, want %d with status %q", resp.StatusCode, body, wantCode, wantStatus)
	}
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
		t.Fatalf("/readyz Content-Type %q", ct)
	}
	return rb
}

// wantChecks checks /readyz's checks: an exact value, or a prefix when
// the wanted value ends in "...".
func wantChecks(t *testing.T, rb readyBody, want map[string]any) {
	t.Helper()
	for name, w := range want {
		got, ok := rb.Checks[name]
		if ws, isString := w.(string); isString && strings.HasSuffix(ws, "...") {
			gs, _ := got.(string)
			if !strings.HasPrefix(gs, strings.TrimSuffix(ws, "...")) || gs == strings.TrimSuffix(ws, "...") {
				t.Errorf("check %s = %v, want %s followed by why", name, got, ws)
			}
			continue
		}
		if !ok || got != w {
			t.Errorf("check %s = %v, want %v (checks %v)", name, got, w, rb.Checks)
		}
	}
}

func TestHealthzAnswersWhileTheProcessLives(t *testing.T) {
	s := startNode(t, node.Config{})
	resp, body := httpDo(t, http.MethodGet, s.URL+"/healthz", "", "")
	if resp.StatusCode != http.StatusOK || strings.TrimSpace(string(body)) != `{"status":"ok"}` {
		t.Fatalf("/healthz %d %s", resp.StatusCode, body)
	}
	// The embedded mode's store is in process: it is ready with nothing to ask.
	rb := readyz(t, s.URL, http.StatusOK)
	wantChecks(t, rb, map[string]any{"draining": false})
}

// TestReadyzNoSourceAnswersSaysWhyAndRecovers kills the node's Redis and
// cuts its PostgreSQL: /readyz fails naming the reason and what each source
// said, then recovers once one source answers again.
func TestReadyzNoSourceAnswersSaysWhyAndRecovers(t *testing.T) {
	c := newPrivateCluster(t)
	cfg, proxy := c.configPostgresBehindProxy(t)
	s := startNode(t, cfg)
	wantChecks(t, readyz(t, s.URL, http.StatusOK), map[string]any{"redis": "ok", "postgres": "ok", "draining": false})

	// PostgreSQL alone down: Redis still serves snapshots, so still ready,
	// and the body says which source is missing.
	proxy.Drop()
	wantChecks(t, readyz(t, s.URL, http.StatusOK), map[string]any{"redis": "ok", "postgres": "down: ...", "draining": false})

	c.rs.Stop()
	rb := readyz(t, s.URL, http.StatusServiceUnavailable)
	if rb.Reason != "no snapshot source answers" || rb.Error != "unavailable" || rb.Message != rb.Reason {
		t.Errorf("/readyz reason %q error %q message %q, want no snapshot source answers, unavailable", rb.Reason, rb.Error, rb.Message)
	}
	wantChecks(t, rb, map[string]any{"redis": "down: ...", "postgres": "down: ...", "draining": false})

	// Each source alone makes the node ready again.
	proxy.Pass()
	wantChecks(t, readyz(t, s.URL, http.StatusOK), map[string]any{"redis": "down: ...", "postgres": "ok"})
	proxy.Drop()
	readyz(t, s.URL, http.StatusServiceUnavailable)
	c.rs.Start()
	wantChecks(t, readyz(t, s.URL, http.StatusOK), map[string]any{"redis": "ok", "postgres": "down: ..."})
}

// TestReadyzFailsWhileDraining drains the hub the way Shutdown starts to.
// Shutdown also closes the listener at that moment, so only a probe already
// in flight would see the answer; draining the hub alone lets the test ask.
func TestReadyzFailsWhileDraining(t *testing.T) {
	c := newPrivateCluster(t)
	s := startNode(t, c.config())
	wantChecks(t, readyz(t, s.URL, http.StatusOK), map[string]any{"draining": false})

	if err := s.Hub().Shutdown(context.Background(), 0); err != nil {
		t.Fatalf("hub shutdown: %v", err)
	}
	rb := readyz(t, s.URL, http.StatusServiceUnavailable)
	if rb.Reason != "draining" || rb.Error != "draining" {
		t.Errorf("/readyz reason %q error %q while draining, want draining", rb.Reason, rb.Error)
	}
	// The sources still answer: the body says draining is the only reason.
	wantChecks(t, rb, map[string]any{"draining": true, "redis": "ok", "postgres": "ok"})
}
