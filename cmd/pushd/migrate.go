package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pushd/pushd/db"
)

// migrateTimeout bounds the whole of pushd migrate.
const migrateTimeout = time.Minute

// migrateCommand is pushd migrate, for development and demos: it creates
// the database --database-url names when it is missing, and applies every
// migration of db/migrations (each creates only what is missing, so it
// may run again). In production the Task State Service owns the schema.
func migrateCommand(args, environ []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("pushd migrate", flag.ContinueOnError)
	url := newEnvironment(environ)["PUSHD_DATABASE_URL"]
	fs.StringVar(&url, "database-url", url, "PostgreSQL URL of the database to create if missing and migrate (PUSHD_DATABASE_URL)")
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "Usage: pushd migrate --database-url URL\n\n"+
			"For development and demos: creates the database if it is missing and applies\n"+
			"every migration of db/migrations (each creates only what is missing). In\n"+
			"production the Task State Service owns the schema.\n\nFlags:")
		fs.PrintDefaults()
	}
	if err := parseArgs(fs, args, stdout); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usageErrorf("unexpected argument %q (run pushd migrate -h for the flags)", fs.Arg(0))
	}
	if url == "" {
		return usageErrorf("--database-url is required (or PUSHD_DATABASE_URL)")
	}
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return usageErrorf("--database-url: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), migrateTimeout)
	defer cancel()
	created, err := createDatabase(ctx, cfg.ConnConfig)
	if err != nil {
		return err
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return fmt.Errorf("database %s: %w", cfg.ConnConfig.Database, err)
	}
	defer pool.Close()
	if err := db.Migrate(ctx, pool); err != nil {
		return fmt.Errorf("database %s: %w", cfg.ConnConfig.Database, err)
	}
	state := "present"
	if created {
		state = "created"
	}
	fmt.Fprintf(stdout, "database %s: %s; %d migrations applied\n", cfg.ConnConfig.Database, state, len(db.Migrations()))
	return nil
}

// createDatabase creates the database cfg names unless it exists, through
// the server's maintenance database, postgres. It reports whether it
// created it.
func createDatabase(ctx context.Context, cfg *pgx.ConnConfig) (bool, error) {
	name := cfg.Database
	admin := cfg.Copy()
	admin.Database = "postgres"
	conn, err := pgx.ConnectConfig(ctx, admin)
	if err != nil {
		return false, fmt.Errorf("postgres (to create database %s): %w", name, err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var exists bool
	if err := conn.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)", name).Scan(&exists); err != nil {
		return false, fmt.Errorf("postgres: %w", err)
	}
	if exists {
		return false, nil
	}
	_, err = conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize())
	var pgErr *pgconn.PgError
	switch {
	case errors.As(err, &pgErr) && pgErr.Code == "42P04": // created meanwhile by another
		return false, nil
	case err != nil:
		return false, fmt.Errorf("create database %s: %w", name, err)
	}
	return true, nil
}
