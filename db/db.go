// Package db holds the PostgreSQL schema pushd reads, as migrations for
// development, tests and the demo. In production the Task State Service owns
// the schema; pushd only reads it.
package db

import (
	"context"
	"embed"
	"fmt"
	"io/fs"
	"path"
	"sort"

	"github.com/jackc/pgx/v5/pgxpool"
)

//go:embed migrations/*.sql
var migrations embed.FS

// Migrations returns the migration files in the order they apply.
func Migrations() []string {
	names, _ := fs.Glob(migrations, "migrations/*.sql")
	sort.Strings(names)
	return names
}

// Migration returns the SQL of one migration, by its file name.
func Migration(name string) (string, error) {
	b, err := migrations.ReadFile(path.Join("migrations", name))
	return string(b), err
}

// Migrate applies every migration. Each is idempotent, so running it twice is
// harmless.
func Migrate(ctx context.Context, pool *pgxpool.Pool) error {
	for _, name := range Migrations() {
		sql, err := migrations.ReadFile(name)
		if err != nil {
			return err
		}
		if _, err := pool.Exec(ctx, string(sql)); err != nil {
			return fmt.Errorf("migrate %s: %w", name, err)
		}
	}
	return nil
}
