package testenv

import (
	"context"
	"net/url"
	"testing"

	"github.com/pushd/pushd/db"
)

// BareSchema makes a schema of its own in p's database with only the
// migrations named (file names of db/migrations) applied in it, and
// returns a database URL whose search path is that schema alone: to a
// node or a store, a database that has only those.
func (p Postgres) BareSchema(t testing.TB, migrations ...string) string {
	t.Helper()
	ctx := Context(t)
	name := "bare_" + RandomSuffix(6)
	if _, err := p.Pool.Exec(ctx, "CREATE SCHEMA "+name); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Pool.Exec(context.Background(), "DROP SCHEMA "+name+" CASCADE") })
	conn, err := p.Pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, "SET search_path TO "+name); err != nil {
		t.Fatal(err)
	}
	for _, m := range migrations {
		sql, err := db.Migration(m)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := conn.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", m, err)
		}
	}
	if _, err := conn.Exec(ctx, "RESET search_path"); err != nil {
		t.Fatal(err)
	}
	u, err := url.Parse(p.URL)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set("search_path", name)
	u.RawQuery = q.Encode()
	return u.String()
}

// LockTasks locks generation_tasks until the returned function (or the
// test's end): every query of it waits, as behind a migration or a stuck
// writer.
func (p Postgres) LockTasks(t testing.TB) (unlock func()) {
	t.Helper()
	ctx := Context(t)
	tx, err := p.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, "LOCK TABLE generation_tasks IN ACCESS EXCLUSIVE MODE"); err != nil {
		tx.Rollback(ctx)
		t.Fatal(err)
	}
	unlock = func() { tx.Rollback(context.Background()) }
	t.Cleanup(unlock)
	return unlock
}
