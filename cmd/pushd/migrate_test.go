package main

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pushd/pushd/db"
	"github.com/pushd/pushd/internal/testenv"
)

// pushd migrate creates a missing database and leaves it with every
// migration's work; run again, it finds the database and changes nothing.
// Without a URL it is refused as a command line.
func TestMigrateCreatesAndMigrates(t *testing.T) {
	url := testenv.MissingDatabase(t)
	name := url[strings.LastIndex(url, "/")+1:]
	name, _, _ = strings.Cut(name, "?")
	for i, want := range []string{"created", "present"} {
		out, errOut, code := runCLI(t, env("PUSHD_DATABASE_URL", url), "", "migrate")
		if code != 0 || out != fmt.Sprintf("database %s: %s; %d migrations applied\n", name, want, len(db.Migrations())) {
			t.Fatalf("run %d: exit %d, stdout %q, stderr %q; want the database %s", i+1, code, out, errOut, want)
		}
	}
	pool, err := pgxpool.New(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if missing, err := db.Missing(context.Background(), pool); err != nil || len(missing) > 0 {
		t.Errorf("after pushd migrate the database lacks %v (%v)", missing, err)
	}

	_, errOut, code := runCLI(t, nil, "", "migrate")
	if code != 2 || !strings.Contains(errOut, "--database-url is required") {
		t.Errorf("without a URL: exit %d, stderr %q; want 2 naming --database-url", code, errOut)
	}
}
