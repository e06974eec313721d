package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/pushd/pushd/internal/testenv"
)

// productionBlocks returns the two sh blocks of the README's Production
// setup that a test can run: the one that makes the secret, applies the
// migrations and starts the node, and the one that opens the first stream
// and makes the first change.
func productionBlocks(t *testing.T) (node, first string) {
	t.Helper()
	section, _, _ := strings.Cut(docFrom(t, "../../README.md", "\n## Production setup\n"), "\n## ")
	for _, block := range fencedBlocks(t, section, "sh") {
		switch {
		case strings.Contains(block, "db/migrations/"):
			node = block
		case strings.Contains(block, "./pushd token"):
			first = block
		}
	}
	if node == "" || first == "" {
		t.Fatalf("README's Production setup lacks the node block (db/migrations) or the first-stream block (./pushd token):\n%s", section)
	}
	return node, first
}

// script is a bash script run in its own process group, its output kept.
type script struct {
	cmd    *exec.Cmd
	log    *logBuffer
	exited chan struct{}
}

func runScript(t *testing.T, dir string, environ []string, text string) *script {
	t.Helper()
	s := &script{log: newLogBuffer(), exited: make(chan struct{})}
	s.cmd = exec.Command("bash", "-c", text)
	s.cmd.Dir, s.cmd.Env = dir, environ
	s.cmd.Stdout, s.cmd.Stderr = s.log, s.log
	s.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true} // so a stop reaches its background jobs too
	if err := s.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		s.cmd.Wait()
		close(s.exited)
	}()
	t.Cleanup(func() { s.stop(t, syscall.SIGKILL) })
	return s
}

// stop signals the script's process group and waits for the script to end.
func (s *script) stop(t *testing.T, sig syscall.Signal) {
	t.Helper()
	select {
	case <-s.exited:
		return
	default:
	}
	syscall.Kill(-s.cmd.Process.Pid, sig)
	<-s.exited
}

var (
	writtenRE   = regexp.MustCompile(`\{"written":(true|false),"task_id":"task_1","version":1\}`)
	logProblems = regexp.MustCompile(`(?m)^.*level=(WARN|ERROR).*$`)
)

// TestReadmeProductionSetup runs the README's Production setup as written,
// twice in a row in one directory, against the shared Redis (under a key
// prefix of its own) and a PostgreSQL database that does not exist yet:
// the secret and the key are made, the database created and migrated, the node
// started; then a token minted, a stream of project p1 opened, the row
// written and the change published. Each run must show task_1 at version 1
// on the stream once, the first run's publish written, and a node log
// without a warning. The repair is set far apart so that it cannot store
// the row between the insert and the publish.
func TestReadmeProductionSetup(t *testing.T) {
	for _, tool := range []string{"bash", "curl", "openssl", "psql"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("the Production setup needs %s (scripts/test installs it): %v", tool, err)
		}
	}
	nodeScript, firstScript := productionBlocks(t)
	if !strings.Contains(firstScript, "localhost:8080") {
		t.Fatalf("the first-stream block no longer talks to localhost:8080:\n%s", firstScript)
	}
	redis := testenv.SharedRedis(t)
	databaseURL := testenv.MissingDatabase(t) // the block creates it

	// The blocks run from the repository's root with ./pushd built there:
	// here, a directory holding the migrations and the test's binary.
	dir := t.TempDir()
	migrations, err := filepath.Abs("../../db")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(migrations, filepath.Join(dir, "db")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(binary(t), filepath.Join(dir, "pushd")); err != nil {
		t.Fatal(err)
	}
	environ := append(envWithoutPushd(),
		"REDIS_URL="+redis.URL, "DATABASE_URL="+databaseURL, "HOSTNAME=readme-node",
		"PUSHD_KEY_PREFIX="+redis.Names.Prefix, "PUSHD_LISTEN=127.0.0.1:0", "PUSHD_ADMIN_LISTEN=127.0.0.1:0",
		"PUSHD_REPAIR_INTERVAL=1h")

	for run := 1; run <= 2; run++ {
		node := runScript(t, dir, environ, nodeScript)
		addr := node.log.wait(t, servingRE, node.exited)[1]
		// The stream runs until the test has seen what it waits for.
		first := runScript(t, dir, environ, strings.ReplaceAll(firstScript, "localhost:8080", addr)+"wait\n")
		first.log.wait(t, task1AtVersion1, first.exited)
		written := first.log.wait(t, writtenRE, first.exited)[1]
		first.stop(t, syscall.SIGTERM)
		node.stop(t, syscall.SIGTERM)
		if code := node.cmd.ProcessState.ExitCode(); code != 0 {
			t.Errorf("run %d: the node exited %d on SIGTERM:\n%s", run, code, node.log)
		}

		out := first.log.String()
		if !strings.Contains(out, "event: hello") || strings.Count(out, "event: task") != 1 {
			t.Errorf("run %d: want a hello and task_1 once on the stream:\n%s", run, out)
		}
		if run == 1 && written != "true" {
			t.Errorf("run 1: the first publish of task_1 was not written:\n%s", out)
		}
		if m := logProblems.FindAllString(node.log.String(), -1); len(m) > 0 {
			t.Errorf("run %d: the node warned:\n%s\nwhole output:\n%s", run, strings.Join(m, "\n"), node.log)
		}
	}

	var left []string
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		left = append(left, e.Name())
	}
	if want := []string{"api.key", "db", "jwt.secret", "pushd"}; !slices.Equal(left, want) {
		t.Errorf("the Production setup left %v where it ran, want %v", left, want)
	}
	for _, name := range []string{"api.key", "jwt.secret"} {
		fi, err := os.Stat(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != 0o600 {
			t.Errorf("%s is %v: want a file only its owner reads", name, fi.Mode().Perm())
		}
	}
}
