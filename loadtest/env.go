package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/pushd/pushd/db"
)

func randomHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// proc is a child process the controller owns: killed when the run ends or
// the controller dies.
type proc struct {
	name string
	cmd  *exec.Cmd
	done chan struct{} // closed when it exited
	err  error         // its exit, once done is closed
}

func startProc(name string, cmd *exec.Cmd) (*proc, error) {
	cmd.SysProcAttr = childAttr()
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &proc{name: name, cmd: cmd, done: make(chan struct{})}
	go func() { p.err = cmd.Wait(); close(p.done) }()
	return p, nil
}

func (p *proc) pid() int { return p.cmd.Process.Pid }

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// kill sends SIGKILL and waits for the exit.
func (p *proc) kill() {
	if p == nil {
		return
	}
	p.cmd.Process.Kill()
	<-p.done
}

// stop sends SIGTERM, waits up to timeout, then kills.
func (p *proc) stop(timeout time.Duration) {
	p.cmd.Process.Signal(syscall.SIGTERM)
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-p.done:
	case <-t.C:
		p.kill()
	}
}

// redisServer is the run's private redis-server: no persistence, so a
// restart comes back empty.
type redisServer struct {
	cpus string // -pin: the CPUs it runs on
	nice int    // -redis-nice: its scheduling priority, 0 to leave it
	bin  string
	dir  string
	port int
	args []string // extra redis-server arguments (a cluster node's)
	proc *proc
}

func (r *redisServer) url() string  { return "redis://127.0.0.1:" + strconv.Itoa(r.port) + "/0" }
func (r *redisServer) addr() string { return "127.0.0.1:" + strconv.Itoa(r.port) }

func (r *redisServer) start(ctx context.Context) error {
	cmd := exec.Command(r.bin, "--port", strconv.Itoa(r.port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", r.dir,
		"--logfile", filepath.Join(r.dir, "redis.log"), "--maxclients", "10000")
	cmd.Args = append(cmd.Args, r.args...)
	if err := pinTo(cmd, r.cpus); err != nil {
		return err
	}
	p, err := startProc("redis-server", cmd)
	if err != nil {
		return err
	}
	r.proc = p
	if r.nice != 0 {
		if err := renice(cmd.Process.Pid, r.nice); err != nil {
			return fmt.Errorf("redis-server: -redis-nice %d: %w", r.nice, err)
		}
	}
	c := redis.NewClient(&redis.Options{Addr: r.addr(), MaxRetries: -1})
	defer c.Close()
	return waitFor(ctx, 10*time.Second, p, func() bool {
		pctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		return c.Ping(pctx).Err() == nil
	})
}

// waitFor polls ready every 10 ms until it holds, the process exits or the
// time is up. It is polling a server that is starting: there is nothing to
// wait on.
func waitFor(ctx context.Context, timeout time.Duration, p *proc, ready func() bool) error {
	deadline := time.Now().Add(timeout)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		if ready() {
			return nil
		}
		if p != nil && p.exited() {
			return fmt.Errorf("%s exited at start: %v", p.name, p.err)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not ready after %v", p.name, timeout)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}
}

// database is a PostgreSQL database of the run's own, dropped at the end.
type database struct {
	name  string
	url   string
	admin *pgxpool.Pool
	pool  *pgxpool.Pool
}

func createDatabase(ctx context.Context, adminURL string) (*database, error) {
	admin, err := pgxpool.New(ctx, adminURL)
	if err != nil {
		return nil, fmt.Errorf("-database-url: %w", err)
	}
	if err := admin.Ping(ctx); err != nil {
		admin.Close()
		return nil, fmt.Errorf("PostgreSQL at %s: %w", adminURL, err)
	}
	d := &database{name: "pushd_loadtest_" + randomHex(6), admin: admin}
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+d.name); err != nil {
		admin.Close()
		return nil, fmt.Errorf("create database: %w", err)
	}
	u, _ := url.Parse(adminURL)
	u.Path = "/" + d.name
	d.url = u.String()
	cfg, err := pgxpool.ParseConfig(d.url)
	if err == nil {
		cfg.MaxConns = 32
		// The publisher's row updates need not wait for the disk: the
		// database is dropped at the end, and it keeps PostgreSQL cheap on a
		// machine the server shares.
		cfg.ConnConfig.RuntimeParams["synchronous_commit"] = "off"
		d.pool, err = pgxpool.NewWithConfig(ctx, cfg)
	}
	if err == nil {
		err = db.Migrate(ctx, d.pool)
	}
	if err != nil {
		d.drop()
		return nil, fmt.Errorf("database %s: %w", d.name, err)
	}
	return d, nil
}

// drop closes the pools and drops the database, whoever is still connected.
func (d *database) drop() {
	if d == nil {
		return
	}
	if d.pool != nil {
		d.pool.Close()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	d.admin.Exec(ctx, "DROP DATABASE IF EXISTS "+d.name+" WITH (FORCE)")
	d.admin.Close()
}

// insertTasks writes every task's row at version 1, as the Task State
// Service created them.
func (d *database) insertTasks(ctx context.Context, tasks, tenants int, at time.Time) error {
	rows := make([][]any, tasks)
	for i := range rows {
		rows[i] = []any{taskID(i), tenantOf(i, tenants), projectOf(i, tenants), userOf(i, tenants),
			"QUEUED", int32(0), "queued", "veo", "veo-3", int32(i % 50), int64(1), at}
	}
	_, err := d.pool.CopyFrom(ctx, pgx.Identifier{"generation_tasks"},
		[]string{"id", "tenant_id", "project_id", "user_id", "status", "progress", "stage", "provider", "model", "queue_position", "version", "updated_at"},
		pgx.CopyFromRows(rows))
	if err != nil {
		return fmt.Errorf("insert tasks: %w", err)
	}
	return nil
}

// serverProc is the node under test, pushd or Centrifugo, started and
// restarted on one port.
type serverProc struct {
	name   string // pushd or centrifugo: the process and its log files
	health string // the path that answers 200 once it serves
	bin    string
	args   []string
	env    []string
	port   int
	// adminPort, when set, is the admin listener's, which serves /metrics
	// (pushd's --admin-listen); a server older than it (-server-src) serves
	// them on port, which a failed scrape of adminPort falls back to.
	adminPort int
	debugPort int // -profile-nodes: the debug listener's (pprof)
	logDir    string
	cpus      string // -pin: the CPUs it runs on
	starts    int

	mu   sync.Mutex
	proc *proc // guarded by mu
	log  *os.File
}

func (s *serverProc) baseURL() string { return "http://127.0.0.1:" + strconv.Itoa(s.port) }

// adminURLs are where the server's /metrics and health path may be, in
// the order to try: the admin listener first, which a herd of clients
// filling the clients' port's accept queue does not hold up.
func (s *serverProc) adminURLs() []string {
	if s.adminPort == 0 {
		return []string{s.baseURL()}
	}
	return []string{"http://127.0.0.1:" + strconv.Itoa(s.adminPort), s.baseURL()}
}

func (s *serverProc) current() *proc {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.proc
}

// start runs the server and returns once it answers its health path: the
// time it first did.
func (s *serverProc) start(ctx context.Context) (time.Time, error) {
	s.starts++
	logf, err := os.Create(filepath.Join(s.logDir, fmt.Sprintf("%s.%d.log", s.name, s.starts)))
	if err != nil {
		return time.Time{}, err
	}
	cmd := exec.Command(s.bin, s.args...)
	cmd.Env = append(os.Environ(), s.env...)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := pinTo(cmd, s.cpus); err != nil {
		logf.Close()
		return time.Time{}, err
	}
	p, err := startProc(s.name, cmd)
	if err != nil {
		logf.Close()
		return time.Time{}, err
	}
	s.mu.Lock()
	s.proc, s.log = p, logf
	s.mu.Unlock()
	client := &http.Client{Timeout: time.Second}
	var up time.Time
	err = waitFor(ctx, 30*time.Second, p, func() bool {
		for _, base := range s.adminURLs() {
			resp, err := client.Get(base + s.health)
			if err != nil {
				continue
			}
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				up = time.Now()
				return true
			}
		}
		return false
	})
	if err != nil {
		return time.Time{}, fmt.Errorf("%w; log: %s", err, s.logTail())
	}
	return up, nil
}

// startAccepting starts the server and returns the moment its port first
// accepted a connection, polled every 2 ms.
func (s *serverProc) startAccepting(ctx context.Context) (time.Time, error) {
	accepted := make(chan time.Time, 1)
	pctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		tick := time.NewTicker(2 * time.Millisecond)
		defer tick.Stop()
		for {
			c, err := net.DialTimeout("tcp", "127.0.0.1:"+strconv.Itoa(s.port), 100*time.Millisecond)
			if err == nil {
				accepted <- time.Now()
				c.Close()
				return
			}
			select {
			case <-pctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
	if _, err := s.start(ctx); err != nil {
		return time.Time{}, err
	}
	select {
	case t := <-accepted:
		return t, nil
	case <-ctx.Done():
		return time.Time{}, ctx.Err()
	}
}

func (s *serverProc) logTail() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.log == nil {
		return ""
	}
	b, _ := os.ReadFile(s.log.Name())
	if len(b) > 2000 {
		b = b[len(b)-2000:]
	}
	return string(bytes.TrimSpace(b))
}

// stop sends SIGTERM and waits for the drain to end.
func (s *serverProc) stop(timeout time.Duration) {
	p := s.current()
	if p == nil {
		return
	}
	p.stop(timeout)
	s.mu.Lock()
	if s.log != nil {
		s.log.Close()
	}
	s.mu.Unlock()
}

func (s *serverProc) kill() {
	if p := s.current(); p != nil {
		p.kill()
	}
}

// buildServer builds pushd once for the whole invocation and names the
// commit it was built from.
func buildServer(ctx context.Context, cfg config, tmp string) (bin, commit string, err error) {
	repo := cfg.Repo
	if repo == "" {
		out, err := exec.CommandContext(ctx, "go", "env", "GOMOD").Output()
		if err != nil || strings.TrimSpace(string(out)) == "" || strings.TrimSpace(string(out)) == os.DevNull {
			return "", "", fmt.Errorf("cannot find the pushd module (run from the repository or pass -repo): %v", err)
		}
		repo = filepath.Dir(strings.TrimSpace(string(out)))
	}
	git := func(args ...string) (string, error) {
		out, err := exec.CommandContext(ctx, "git", append([]string{"-C", repo}, args...)...).Output()
		return strings.TrimSpace(string(out)), err
	}
	rev := "HEAD"
	if cfg.ServerSrc != "head" && cfg.ServerSrc != "worktree" {
		rev = cfg.ServerSrc
	}
	commit, err = git("rev-parse", "--short", rev+"^{commit}")
	if err != nil && rev != "HEAD" {
		return "", "", fmt.Errorf("-server-src %q: not a revision of %s", rev, repo)
	}
	if cfg.ServerBin != "" {
		if commit != "" {
			commit += " (prebuilt " + filepath.Base(cfg.ServerBin) + ")"
		}
		return cfg.ServerBin, commit, nil
	}
	src := repo
	if cfg.ServerSrc != "worktree" {
		if commit == "" {
			return "", "", fmt.Errorf("-server-src %s needs a git repository at %s", cfg.ServerSrc, repo)
		}
		src = filepath.Join(tmp, "src")
		if err := os.MkdirAll(src, 0o755); err != nil {
			return "", "", err
		}
		tarball := filepath.Join(tmp, "src.tar")
		if _, err := git("archive", "-o", tarball, commit); err != nil {
			return "", "", fmt.Errorf("git archive: %w", err)
		}
		if out, err := exec.CommandContext(ctx, "tar", "-xf", tarball, "-C", src).CombinedOutput(); err != nil {
			return "", "", fmt.Errorf("tar: %v: %s", err, out)
		}
	} else if st, _ := git("status", "--porcelain", "--", ".", ":!loadtest", ":!docs"); st != "" {
		commit += "+worktree"
	}
	bin = filepath.Join(tmp, "pushd")
	cmd := exec.CommandContext(ctx, "go", "build", "-o", bin, "./cmd/pushd")
	cmd.Dir = src
	// The server's module alone, as a release builds it: not the
	// workspace that brings the load generator's in.
	cmd.Env = append(os.Environ(), "GOWORK=off")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", "", fmt.Errorf("build pushd: %v: %s", err, out)
	}
	return bin, commit, nil
}
