// Package testenv gives tests real servers: a fresh PostgreSQL database per
// test package with the schema applied, a key prefix of their own on the
// shared Redis, and a private redis-server on a free port for tests that stop
// or cut it. A missing server is a test failure, never a skip.
package testenv

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/pushd/pushd/db"
	"github.com/pushd/pushd/keys"
)

// Defaults for the shared servers; PUSHD_TEST_REDIS_URL and
// PUSHD_TEST_DATABASE_URL override them.
const (
	DefaultRedisURL    = "redis://127.0.0.1:6379/0"
	DefaultDatabaseURL = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"
)

func env(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// RandomSuffix returns n random hex bytes, for names that must not collide
// between test runs.
func RandomSuffix(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// Redis is the shared Redis with a prefix no other test uses.
type Redis struct {
	URL    string
	Client *redis.Client
	Names  keys.Names
}

// SharedRedis returns a client of the shared Redis and a fresh key prefix; it
// deletes the prefix's keys when the test ends. Tests that stop, kill or cut
// Redis must use StartRedis instead.
func SharedRedis(t testing.TB) Redis {
	t.Helper()
	u := env("PUSHD_TEST_REDIS_URL", DefaultRedisURL)
	opt, err := redis.ParseURL(u)
	if err != nil {
		t.Fatalf("testenv: PUSHD_TEST_REDIS_URL: %v", err)
	}
	c := redis.NewClient(opt)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := c.Ping(ctx).Err(); err != nil {
		c.Close()
		t.Fatalf("testenv: shared Redis at %s is not reachable (scripts/test starts one): %v", u, err)
	}
	prefix := "test:" + RandomSuffix(6) + ":"
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		iter := c.Scan(ctx, 0, prefix+"*", 1000).Iterator()
		for iter.Next(ctx) {
			c.Del(ctx, iter.Val())
		}
		c.Close()
	})
	return Redis{URL: u, Client: c, Names: keys.Names{Prefix: prefix}}
}

// RedisServer is a private redis-server owned by one test.
type RedisServer struct {
	Addr string
	URL  string

	t    testing.TB
	dir  string
	port int
	args []string // extra redis-server arguments (cluster mode)
	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{}
}

// StartRedis starts a private redis-server on a free port, keeping nothing on
// disk, and stops it when the test ends.
func StartRedis(t testing.TB) *RedisServer {
	t.Helper()
	if _, err := exec.LookPath("redis-server"); err != nil {
		t.Fatalf("testenv: redis-server not found on PATH (install Debian's redis-server, or run scripts/test): %v", err)
	}
	s := &RedisServer{t: t, dir: t.TempDir(), port: FreePort(t)}
	s.Addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(s.port))
	s.URL = "redis://" + s.Addr + "/0"
	s.Start()
	t.Cleanup(s.Stop)
	return s
}

// Start (re)starts the server on its port and waits until it answers.
func (s *RedisServer) Start() {
	s.t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd != nil {
		return
	}
	cmd := exec.Command("redis-server",
		"--port", strconv.Itoa(s.port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", s.dir,
		"--logfile", filepath.Join(s.dir, "redis.log"))
	cmd.Args = append(cmd.Args, s.args...)
	if err := cmd.Start(); err != nil {
		s.t.Fatalf("testenv: start redis-server: %v", err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	s.cmd, s.done = cmd, done

	c := redis.NewClient(&redis.Options{Addr: s.Addr, MaxRetries: -1})
	defer c.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		err := c.Ping(ctx).Err()
		cancel()
		if err == nil {
			return
		}
		select {
		case <-done:
			log, _ := os.ReadFile(filepath.Join(s.dir, "redis.log"))
			s.t.Fatalf("testenv: redis-server exited at start: %s", log)
		default:
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("testenv: redis-server on %s did not answer: %v", s.Addr, err)
		}
		time.Sleep(20 * time.Millisecond) // polling a server that is starting; nothing to wait on
	}
}

// Stop kills the server and waits for it to exit. Stop on a stopped server
// does nothing.
func (s *RedisServer) Stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return
	}
	s.cmd.Process.Kill()
	<-s.done
	s.cmd, s.done = nil, nil
}

// Running reports whether the server is started.
func (s *RedisServer) Running() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cmd != nil
}

// Client returns a client of the server, closed when the test ends.
func (s *RedisServer) Client() *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: s.Addr})
	s.t.Cleanup(func() { c.Close() })
	return c
}

// FreePort returns a TCP port that was free a moment ago on 127.0.0.1.
func FreePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("testenv: free port: %v", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// Postgres is a database created for one test package.
type Postgres struct {
	URL  string
	Pool *pgxpool.Pool
}

var (
	pgOnce sync.Once
	pgDB   Postgres
	pgErr  error
	pgDrop func()
)

// Database returns the package's own PostgreSQL database, created on first
// use with the schema applied. Call Cleanup from TestMain to drop it.
func Database(t testing.TB) Postgres {
	t.Helper()
	pgOnce.Do(func() { pgDB, pgDrop, pgErr = createDatabase() })
	if pgErr != nil {
		t.Fatalf("testenv: %v", pgErr)
	}
	return pgDB
}

// Cleanup drops the package's database if one was created. Call it from
// TestMain after m.Run.
func Cleanup() {
	if pgDrop != nil {
		pgDrop()
	}
}

func createDatabase() (Postgres, func(), error) {
	admin := env("PUSHD_TEST_DATABASE_URL", DefaultDatabaseURL)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	adminPool, err := pgxpool.New(ctx, admin)
	if err != nil {
		return Postgres{}, nil, fmt.Errorf("PUSHD_TEST_DATABASE_URL: %w", err)
	}
	if err := adminPool.Ping(ctx); err != nil {
		adminPool.Close()
		return Postgres{}, nil, fmt.Errorf("PostgreSQL at %s is not reachable (scripts/test starts one): %w", admin, err)
	}
	name := "pushd_test_" + RandomSuffix(6)
	if _, err := adminPool.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		adminPool.Close()
		return Postgres{}, nil, fmt.Errorf("create database: %w", err)
	}
	u, _ := url.Parse(admin)
	u.Path = "/" + name
	pool, err := pgxpool.New(ctx, u.String())
	if err == nil {
		err = db.Migrate(ctx, pool)
	}
	drop := func() {
		if pool != nil {
			pool.Close()
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		adminPool.Exec(ctx, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)")
		adminPool.Close()
	}
	if err != nil {
		drop()
		return Postgres{}, nil, err
	}
	return Postgres{URL: u.String(), Pool: pool}, drop, nil
}

// EmptyDatabase creates a PostgreSQL database with no schema, for a test
// that applies the migrations itself, and drops it when the test ends. It
// returns the database's URL.
func EmptyDatabase(t testing.TB) string {
	t.Helper()
	admin, name, u := droppedDatabase(t, "pushd_test_empty_")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	adminPool, err := pgxpool.New(ctx, admin)
	if err != nil {
		t.Fatalf("testenv: PUSHD_TEST_DATABASE_URL: %v", err)
	}
	defer adminPool.Close()
	if _, err := adminPool.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		t.Fatalf("testenv: create database (PostgreSQL at %s; scripts/test starts one): %v", admin, err)
	}
	return u
}

// MissingDatabase returns the URL of a database that does not exist yet,
// on the tests' server, for a test of what creates it; it is dropped at
// the test's end.
func MissingDatabase(t testing.TB) string {
	t.Helper()
	_, _, u := droppedDatabase(t, "pushd_test_missing_")
	return u
}

// droppedDatabase names a new database on the tests' server, to be dropped
// (if it was made) when the test ends: the server's admin URL, the name and
// the database's URL.
func droppedDatabase(t testing.TB, prefix string) (admin, name, dbURL string) {
	admin = env("PUSHD_TEST_DATABASE_URL", DefaultDatabaseURL)
	name = prefix + RandomSuffix(6)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if pool, err := pgxpool.New(ctx, admin); err == nil {
			pool.Exec(ctx, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)")
			pool.Close()
		}
	})
	u, _ := url.Parse(admin)
	u.Path = "/" + name
	return admin, name, u.String()
}

// Task is a row of generation_tasks, for tests to insert.
type Task struct {
	ID, TenantID, ProjectID, UserID, Status string
	Progress                                int
	Version                                 int64
	UpdatedAt                               time.Time
}

// InsertTask inserts or replaces a task row.
func (p Postgres) InsertTask(t testing.TB, task Task) {
	t.Helper()
	if task.UpdatedAt.IsZero() {
		task.UpdatedAt = time.Now()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := p.Pool.Exec(ctx, `
		INSERT INTO generation_tasks (id, tenant_id, project_id, user_id, status, progress, version, updated_at)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
		ON CONFLICT (id) DO UPDATE SET tenant_id = $2, project_id = $3, user_id = $4,
			status = $5, progress = $6, version = $7, updated_at = $8`,
		task.ID, task.TenantID, task.ProjectID, task.UserID, task.Status, task.Progress, task.Version, task.UpdatedAt)
	if err != nil {
		t.Fatalf("testenv: insert task %s: %v", task.ID, err)
	}
}

// UniqueID returns an id with the given prefix that no other test uses.
func UniqueID(prefix string) string {
	return strings.TrimSuffix(prefix, "_") + "_" + RandomSuffix(5)
}

// Main runs a package's tests, drops its database, then fails the run if a
// goroutine outlived the tests. The leak check comes after Cleanup because
// the database pool's goroutines end only there. Use it as TestMain.
func Main(m *testing.M) {
	code := m.Run()
	Cleanup()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goroutines left behind:", err)
			code = 1
		}
	}
	os.Exit(code)
}
