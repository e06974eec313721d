package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/pushd/pushd/internal/testenv"
)

// waitFor bounds every wait on an event: a log line, an SSE event, an exit.
const waitFor = 20 * time.Second

// client is the tests' HTTP client; TestMain closes its idle connections
// before the leak check.
var client = &http.Client{Transport: &http.Transport{}}

func TestMain(m *testing.M) {
	code := m.Run()
	testenv.Cleanup() // the package's database, when a test made it
	if bin.dir != "" {
		os.RemoveAll(bin.dir)
	}
	client.CloseIdleConnections()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintf(os.Stderr, "goleak: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}

// bin is the pushd binary, built once for the tests that run it.
var bin struct {
	once sync.Once
	dir  string
	path string
	err  error
}

// binary builds cmd/pushd (the test's working directory) with the go
// command the tests run under; go test puts its GOROOT/bin first on PATH.
func binary(t *testing.T) string {
	t.Helper()
	bin.once.Do(func() {
		gotool, err := exec.LookPath("go")
		if err != nil {
			bin.err = fmt.Errorf("go command: %w", err)
			return
		}
		if bin.dir, bin.err = os.MkdirTemp("", "pushd-test-"); bin.err != nil {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		path := filepath.Join(bin.dir, "pushd")
		out, err := exec.CommandContext(ctx, gotool, "build", "-o", path, ".").CombinedOutput()
		if err != nil {
			bin.err = fmt.Errorf("go build: %w\n%s", err, out)
			return
		}
		bin.path = path
	})
	if bin.err != nil {
		t.Fatal(bin.err)
	}
	return bin.path
}

// envWithoutPushd is this process's environment minus every PUSHD_*
// variable, so a developer's settings cannot leak into a test.
func envWithoutPushd() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "PUSHD_") {
			env = append(env, kv)
		}
	}
	return env
}

// logBuffer collects a log and wakes waiters on every write. It is safe for
// concurrent use.
type logBuffer struct {
	mu      sync.Mutex
	buf     bytes.Buffer
	changed chan struct{} // closed and replaced on each write
}

func newLogBuffer() *logBuffer { return &logBuffer{changed: make(chan struct{})} }

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.buf.Write(p)
	close(l.changed)
	l.changed = make(chan struct{})
	return len(p), nil
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

// wait returns the first match of re in the log, waiting until it appears,
// stop is closed (nil: never) or waitFor passes.
func (l *logBuffer) wait(t *testing.T, re *regexp.Regexp, stop <-chan struct{}) []string {
	t.Helper()
	timer := time.NewTimer(waitFor)
	defer timer.Stop()
	for {
		l.mu.Lock()
		m := re.FindStringSubmatch(l.buf.String())
		changed := l.changed
		l.mu.Unlock()
		if m != nil {
			return m
		}
		select {
		case <-changed:
		case <-stop:
			// The writer may have written its last line just before.
			if m := re.FindStringSubmatch(l.String()); m != nil {
				return m
			}
			t.Fatalf("log ended without %v:\n%s", re, l)
		case <-timer.C:
			t.Fatalf("no %v in the log within %v:\n%s", re, waitFor, l)
		}
	}
}

// servingRE matches LogStartup's first line, in either log format, and
// captures the bound address.
var servingRE = regexp.MustCompile(`(?:msg="pushd serving[^"]*" addr=|"msg":"pushd serving[^"]*","addr":")([^"\s]+)`)

// adminRE matches the admin listener's startup line and captures its address.
var adminRE = regexp.MustCompile(`(?:msg="admin serving" addr=|"msg":"admin serving","addr":")([^"\s]+)`)

// proc is a pushd process.
type proc struct {
	cmd    *exec.Cmd
	log    *logBuffer // stdout and stderr
	exited chan struct{}
	err    error // from Wait, once exited is closed
	URL    string
	// AdminURL is the admin listener's: /metrics.
	AdminURL string
}

// startBinary runs the pushd binary with args, no PUSHD_* variables,
// --listen 127.0.0.1:0 and --admin-listen 127.0.0.1:0, and returns once it
// logs the addresses it serves.
// The kernel picks the port, so no other process can take it in between.
func startBinary(t *testing.T, args ...string) *proc {
	t.Helper()
	return startBinaryEnv(t, nil, args...)
}

// startBinaryEnv is startBinary with the PUSHD_* variables of env.
func startBinaryEnv(t *testing.T, env []string, args ...string) *proc {
	t.Helper()
	p := &proc{log: newLogBuffer(), exited: make(chan struct{})}
	p.cmd = exec.Command(binary(t), append([]string{"--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"}, args...)...)
	p.cmd.Env = append(envWithoutPushd(), env...)
	p.cmd.Stdout, p.cmd.Stderr = p.log, p.log
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		p.err = p.cmd.Wait()
		close(p.exited)
	}()
	t.Cleanup(func() {
		select {
		case <-p.exited:
		default:
			p.cmd.Process.Kill()
			<-p.exited
		}
		if t.Failed() {
			t.Logf("pushd log:\n%s", p.log)
		}
	})
	p.AdminURL = "http://" + p.log.wait(t, adminRE, p.exited)[1]
	p.URL = "http://" + p.log.wait(t, servingRE, p.exited)[1]
	return p
}

// waitExit waits for the process to exit and returns its exit code.
func (p *proc) waitExit(t *testing.T) int {
	t.Helper()
	select {
	case <-p.exited:
	case <-time.After(waitFor):
		t.Fatalf("pushd still running %v after the signal", waitFor)
	}
	var exit *exec.ExitError
	if p.err != nil && !errors.As(p.err, &exit) {
		t.Fatalf("wait: %v", p.err)
	}
	return p.cmd.ProcessState.ExitCode()
}

// httpDo sends a request, with the headers given as name, value pairs
// (Host sets the request's host), and returns the answer with its body
// read.
func httpDo(t *testing.T, method, url, tok, body string, header ...string) (*http.Response, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if tok != "" {
		req.Header.Set("Authorization", "Bearer "+tok)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	for i := 0; i+1 < len(header); i += 2 {
		if header[i] == "Host" { // net/http sends req.Host, never a Host header
			req.Host = header[i+1]
			continue
		}
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, b
}

// decode unmarshals b into v or fails the test.
func decode(t *testing.T, b []byte, v any) {
	t.Helper()
	if err := json.Unmarshal(b, v); err != nil {
		t.Fatalf("decode %s: %v", b, err)
	}
}

type sseClient = testenv.SSEClient

// openSSE opens GET base+path with a bearer token and fails unless the
// answer is a 200 event stream.
func openSSE(t *testing.T, base, path, tok string) *sseClient {
	t.Helper()
	c := testenv.OpenSSE(t, client, base+path, "Authorization", "Bearer "+tok, "Accept", "text/event-stream")
	if c.Status != http.StatusOK || !strings.HasPrefix(c.Header.Get("Content-Type"), "text/event-stream") {
		t.Fatalf("GET %s: %d %s %s", path, c.Status, c.Header.Get("Content-Type"), c.Body)
	}
	return c
}

// docFrom returns the text of the file at path that follows the first
// occurrence of after.
func docFrom(t *testing.T, path, after string) string {
	t.Helper()
	doc, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(doc), after)
	if !ok {
		t.Fatalf("%s no longer says %q", path, after)
	}
	return rest
}

// fencedBlocks returns the bodies of text's fenced code blocks of language
// lang, in order. An unclosed block fails the test: the doc's shape
// changed.
func fencedBlocks(t *testing.T, text, lang string) []string {
	t.Helper()
	var blocks []string
	for {
		_, block, ok := strings.Cut(text, "```"+lang+"\n")
		if !ok {
			return blocks
		}
		block, text, ok = strings.Cut(block, "```\n")
		if !ok {
			t.Fatalf("a %s block is not closed:\n%s", lang, block)
		}
		blocks = append(blocks, block)
	}
}

// fencedBlock is the first block of language lang in the file at path
// after the first occurrence of after.
func fencedBlock(t *testing.T, path, after, lang string) string {
	t.Helper()
	blocks := fencedBlocks(t, docFrom(t, path, after), lang)
	if len(blocks) == 0 {
		t.Fatalf("%s has no %s block after %q", path, lang, after)
	}
	return blocks[0]
}
