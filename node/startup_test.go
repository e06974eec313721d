package node_test

import (
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

// startupWarnings are the log's "postgres does not answer at start" records.
func startupWarnings(t *testing.T, logs *testenv.LogBuffer) []map[string]any {
	t.Helper()
	var out []map[string]any
	for line := range strings.SplitSeq(strings.TrimSpace(logs.String()), "\n") {
		if line == "" {
			continue
		}
		var rec map[string]any
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatalf("log line %q: %v", line, err)
		}
		if rec["msg"] == "postgres does not answer at start; serving from Redis until it does" {
			out = append(out, rec)
		}
	}
	return out
}

// TestStartWarnsWhenPostgresDoesNotAnswer points a node at a PostgreSQL
// port nobody listens on: the node starts and serves, and its log says at
// once which address did not answer and why, without the password.
func TestStartWarnsWhenPostgresDoesNotAnswer(t *testing.T) {
	t.Cleanup(func() { testenv.WaitDialRetriesEnded(t) })
	r := testenv.SharedRedis(t)
	port := testenv.FreePort(t) // reserved, then closed
	const password = "pw_4b1d9e"
	var logs testenv.LogBuffer
	s := startNode(t, node.Config{
		RedisURL: r.URL, KeyPrefix: r.Names.Prefix,
		DatabaseURL: fmt.Sprintf("postgres://pushd:%s@127.0.0.1:%d/tasks?sslmode=disable", password, port),
		Logger:      slog.New(slog.NewJSONHandler(&logs, nil)),
	})

	warns := startupWarnings(t, &logs)
	if len(warns) != 1 {
		t.Fatalf("%d start-up warnings, want 1:\n%s", len(warns), logs.String())
	}
	w := warns[0]
	if w["level"] != "WARN" || w["addr"] != "127.0.0.1:"+strconv.Itoa(port) || w["database"] != "tasks" || w["user"] != "pushd" {
		t.Errorf("warning %v, want level WARN, addr 127.0.0.1:%d, database tasks, user pushd", w, port)
	}
	if err, _ := w["err"].(string); !strings.Contains(err, "refused") {
		t.Errorf("warning's err %q, want the dial error", err)
	}
	if strings.Contains(logs.String(), password) {
		t.Errorf("the log shows the password:\n%s", logs.String())
	}
	resp, body := httpDo(t, http.MethodGet, s.URL+"/healthz", "", "")
	if resp.StatusCode != http.StatusOK {
		t.Errorf("/healthz %d %s: the node should serve without PostgreSQL", resp.StatusCode, body)
	}
}

// TestStartIsQuietWhenPostgresAnswers: no warning for a PostgreSQL that
// answers.
func TestStartIsQuietWhenPostgresAnswers(t *testing.T) {
	r := testenv.SharedRedis(t)
	var logs testenv.LogBuffer
	startNode(t, node.Config{
		RedisURL: r.URL, KeyPrefix: r.Names.Prefix, DatabaseURL: testenv.Database(t).URL,
		Logger: slog.New(slog.NewJSONHandler(&logs, nil)),
	})
	if warns := startupWarnings(t, &logs); len(warns) != 0 {
		t.Errorf("start-up warnings %v for a PostgreSQL that answers", warns)
	}
}
