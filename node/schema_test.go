package node_test

import (
	"log/slog"
	"net/http"
	"strings"
	"testing"

	"github.com/pushd/pushd/internal/testenv"
	"github.com/pushd/pushd/node"
)

func bareSchema(t *testing.T, migrations ...string) string {
	return testenv.Database(t).BareSchema(t, migrations...)
}

// A node whose database has none of the schema warns at start, naming every
// migration, and is not ready: every read Redis cannot serve would answer
// 503. With the tasks' table alone it is ready, and a session token it
// cannot look up is answered 503 with the reason in the log.
func TestMissingSchemaIsWarnedOfAndNotReady(t *testing.T) {
	r := testenv.SharedRedis(t)
	t.Run("none", func(t *testing.T) {
		var logs testenv.LogBuffer
		s := startNode(t, node.Config{RedisURL: r.URL, KeyPrefix: r.Names.Prefix, DatabaseURL: bareSchema(t),
			Logger: slog.New(slog.NewJSONHandler(&logs, nil))})
		// The trigger of 0006 is only for nodes that read the changes.
		want := "missing=0001_generation_tasks.sql,0002_sessions.sql,0003_changes_by_scope.sql,0004_session_projects.sql,0005_task_extra.sql\""
		if !strings.Contains(logs.String(), `"postgres lacks part of the schema pushd reads`) ||
			!strings.Contains(strings.ReplaceAll(logs.String(), `"missing":"`, "missing="), want) {
			t.Errorf("start-up log lacks the missing schema (%s):\n%s", want, logs.String())
		}
		rb := readyz(t, s.URL, http.StatusServiceUnavailable)
		wantChecks(t, rb, map[string]any{"redis": "ok", "postgres": "schema missing"})
	})
	t.Run("tasks only", func(t *testing.T) {
		var logs testenv.LogBuffer
		s := startNode(t, node.Config{RedisURL: r.URL, KeyPrefix: r.Names.Prefix, DatabaseURL: bareSchema(t, "0001_generation_tasks.sql"),
			Logger: slog.New(slog.NewJSONHandler(&logs, nil))})
		if !strings.Contains(logs.String(), `"missing":"0002_sessions.sql,0003_changes_by_scope.sql,0004_session_projects.sql,0005_task_extra.sql"`) {
			t.Errorf("start-up log lacks the missing migrations:\n%s", logs.String())
		}
		rb := readyz(t, s.URL, http.StatusOK)
		wantChecks(t, rb, map[string]any{"redis": "ok", "postgres": "ok"})

		resp, body := httpDo(t, http.MethodGet, s.URL+"/v1/tasks/task_1", sessionToken(), "")
		wantError(t, resp, body, http.StatusServiceUnavailable, "unavailable")
		if !strings.Contains(logs.String(), "session lookup in postgres failed") || !strings.Contains(logs.String(), `relation \"sessions\" does not exist`) {
			t.Errorf("the failed session lookup is not logged with its reason:\n%s", logs.String())
		}
	})
	t.Run("reader without its trigger", func(t *testing.T) {
		var logs testenv.LogBuffer
		dbURL := bareSchema(t, "0001_generation_tasks.sql", "0002_sessions.sql", "0003_changes_by_scope.sql", "0004_session_projects.sql", "0005_task_extra.sql")
		startNode(t, node.Config{RedisURL: r.URL, KeyPrefix: r.Names.Prefix, DatabaseURL: dbURL, ReadChanges: true,
			Logger: slog.New(slog.NewJSONHandler(&logs, nil))})
		if !strings.Contains(logs.String(), "--read-changes: postgres lacks the trigger") || !strings.Contains(logs.String(), "0006_task_changes.sql") ||
			strings.Contains(logs.String(), "lacks part of the schema") {
			t.Errorf("start-up log does not say the reader lacks its trigger, and only that:\n%s", logs.String())
		}
	})
}
