package db

import (
	"context"
	"strings"

	"github.com/jackc/pgx/v5"
)

// schemaChecks are what pushd reads of each migration's work, by the file
// that does it. to_regclass follows the search path, as pushd's own
// queries do.
var schemaChecks = []struct{ migration, sql string }{
	{"0001_generation_tasks.sql", `to_regclass('generation_tasks') IS NOT NULL`},
	{"0002_sessions.sql", `to_regclass('sessions') IS NOT NULL`},
	{"0003_changes_by_scope.sql", `to_regclass('generation_tasks_tenant_project_updated') IS NOT NULL AND to_regclass('generation_tasks_tenant_user_updated') IS NOT NULL`},
	{"0004_session_projects.sql", `EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = to_regclass('sessions') AND attname = 'projects' AND NOT attisdropped)`},
	{"0005_task_extra.sql", `EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = to_regclass('generation_tasks') AND attname = 'extra' AND NOT attisdropped)`},
	{"0006_task_changes.sql", `EXISTS (SELECT 1 FROM pg_trigger WHERE tgrelid = to_regclass('generation_tasks') AND tgname = 'pushd_task_changed') AND to_regclass('generation_tasks_updated') IS NOT NULL`},
}

// TasksMigration is the migration that makes the table of tasks, without
// which pushd can read nothing from the database.
const TasksMigration = "0001_generation_tasks.sql"

// ChangesMigration is the migration that announces each committed change
// of a task: only nodes that read the changes (--read-changes) need it.
const ChangesMigration = "0006_task_changes.sql"

var sqlSchema = func() string {
	parts := make([]string, len(schemaChecks))
	for i, c := range schemaChecks {
		parts[i] = c.sql
	}
	return "SELECT " + strings.Join(parts, ", ")
}()

// A Querier runs one query: a *pgxpool.Pool, a *pgx.Conn.
type Querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Missing names, in order, the migrations whose work the database lacks,
// in one query: what a node reads through none of them fails.
func Missing(ctx context.Context, q Querier) ([]string, error) {
	found := make([]bool, len(schemaChecks))
	dest := make([]any, len(found))
	for i := range found {
		dest[i] = &found[i]
	}
	if err := q.QueryRow(ctx, sqlSchema).Scan(dest...); err != nil {
		return nil, err
	}
	var missing []string
	for i, ok := range found {
		if !ok {
			missing = append(missing, schemaChecks[i].migration)
		}
	}
	return missing, nil
}
