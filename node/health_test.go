package node_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/pushd/pushd/internal/testenv"
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

// wantChecks checks /readyz's checks.
func wantChecks(t *testing.T, rb readyBody, want map[string]any) {
	t.Helper()
	for name, w := range want {
		if got, ok := rb.Checks[name]; !ok || got != w {
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
// cuts its PostgreSQL: /readyz fails naming the reason and which source is
// down, then recovers once one source answers again.
func TestReadyzNoSourceAnswersSaysWhyAndRecovers(t *testing.T) {
	c := newPrivateCluster(t)
	cfg, proxy := c.configPostgresBehindProxy(t)
	s := startNode(t, cfg)
	wantChecks(t, readyz(t, s.URL, http.StatusOK), map[string]any{"redis": "ok", "postgres": "ok", "draining": false})

	// PostgreSQL alone down: Redis still serves snapshots, so still ready,
	// and the body says which source is missing.
	proxy.Drop()
	wantChecks(t, readyz(t, s.URL, http.StatusOK), map[string]any{"redis": "ok", "postgres": "down", "draining": false})

	c.rs.Stop()
	rb := readyz(t, s.URL, http.StatusServiceUnavailable)
	if rb.Reason != "no snapshot source answers" || rb.Error != "unavailable" || rb.Message != rb.Reason {
		t.Errorf("/readyz reason %q error %q message %q, want no snapshot source answers, unavailable", rb.Reason, rb.Error, rb.Message)
	}
	wantChecks(t, rb, map[string]any{"redis": "down", "postgres": "down", "draining": false})

	// Each source alone makes the node ready again.
	proxy.Pass()
	wantChecks(t, readyz(t, s.URL, http.StatusOK), map[string]any{"redis": "down", "postgres": "ok"})
	proxy.Drop()
	readyz(t, s.URL, http.StatusServiceUnavailable)
	c.rs.Start()
	wantChecks(t, readyz(t, s.URL, http.StatusOK), map[string]any{"redis": "ok", "postgres": "down"})
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

// TestReadyzTellsStrangersOnlyStates points a node at a Redis and a
// PostgreSQL that do not answer, with addresses, a user and a database name
// a stranger should not learn: /readyz says which source is down and nothing
// of why, while the log has the why, once per change of state however often
// /readyz is asked.
func TestReadyzTellsStrangersOnlyStates(t *testing.T) {
	redisPort, pgPort := testenv.FreePort(t), testenv.FreePort(t)
	const pgUser, pgDB = "pushd_probe_user_7f3a", "pushd_probe_db_9c1e"
	// Registered first: runs once the node's clients of the unreachable
	// servers are closed.
	t.Cleanup(func() { testenv.WaitDialRetriesEnded(t) })
	var logs testenv.LogBuffer
	s := startNode(t, node.Config{
		RedisURL:    fmt.Sprintf("redis://127.0.0.1:%d/0", redisPort),
		DatabaseURL: fmt.Sprintf("postgres://%s@127.0.0.1:%d/%s?sslmode=disable", pgUser, pgPort, pgDB),
		Logger:      slog.New(slog.NewJSONHandler(&logs, nil)),
	})
	secrets := []string{pgUser, pgDB, strconv.Itoa(redisPort), strconv.Itoa(pgPort), "127.0.0.1", "dial", "refused"}

	const probes = 5
	for range probes {
		resp, body := httpDo(t, http.MethodGet, s.URL+"/readyz", "", "")
		if resp.StatusCode != http.StatusServiceUnavailable {
			t.Fatalf("/readyz %d %s, want 503", resp.StatusCode, body)
		}
		for _, secret := range secrets {
			if strings.Contains(string(body), secret) {
				t.Fatalf("/readyz tells %q: %s", secret, body)
			}
		}
		var rb readyBody
		if err := json.Unmarshal(body, &rb); err != nil {
			t.Fatalf("/readyz body %s: %v", body, err)
		}
		wantChecks(t, rb, map[string]any{"redis": "down", "postgres": "down", "draining": false})
	}

	// The why is logged, once per source.
	downs := map[string][]string{}
	for line := range strings.SplitSeq(strings.TrimSpace(logs.String()), "\n") {
		var rec struct{ Msg, Source, Err string }
		if json.Unmarshal([]byte(line), &rec) == nil && rec.Msg == "snapshot source down" {
			downs[rec.Source] = append(downs[rec.Source], rec.Err)
		}
	}
	for source, want := range map[string][]string{"redis": {strconv.Itoa(redisPort)}, "postgres": {pgUser, pgDB, strconv.Itoa(pgPort)}} {
		errs := downs[source]
		if len(errs) != 1 {
			t.Fatalf("%d log records of %s down after %d probes, want 1: %q", len(errs), source, probes, errs)
		}
		for _, w := range want {
			if !strings.Contains(errs[0], w) {
				t.Errorf("the log of %s down, %q, lacks %q", source, errs[0], w)
			}
		}
	}
}
