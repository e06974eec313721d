//go:build unix

package testenv

import (
	"bufio"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Browser is a headless Chromium owned by one test, with a fresh profile.
// Drive it over the DevTools protocol (chromedp.NewRemoteAllocator takes
// DevTools).
type Browser struct {
	// DevTools is the browser's DevTools WebSocket URL,
	// ws://127.0.0.1:<port>/devtools/browser/<id>.
	DevTools string
}

// chromiumFlags keep a test browser to itself: no sandbox (tests run as
// root in containers), no GPU, and none of the background connections
// (updates, sync, field trials, QUIC probes) that a closed network refuses
// and that would only slow the browser down.
var chromiumFlags = []string{
	"--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
	"--disable-background-networking", "--disable-component-update", "--disable-sync",
	"--disable-default-apps", "--disable-extensions", "--disable-dev-shm-usage",
	"--password-store=basic", "--use-mock-keychain", "--mute-audio",
	"--remote-debugging-address=127.0.0.1", "--remote-debugging-port=0",
}

// ChromiumPath finds the browser: $PUSHD_TEST_CHROMIUM, else chromium or
// chromium-browser on PATH, else /usr/bin/chromium. It returns "" when
// there is none.
func ChromiumPath() string {
	if p := os.Getenv("PUSHD_TEST_CHROMIUM"); p != "" {
		return p
	}
	for _, name := range []string{"chromium", "chromium-browser"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if _, err := os.Stat("/usr/bin/chromium"); err == nil {
		return "/usr/bin/chromium"
	}
	return ""
}

// StartBrowser starts a headless Chromium for the test and stops it, with
// every process it started, when the test ends. A missing browser is a
// failure, never a skip: scripts/test installs Debian's chromium.
func StartBrowser(t testing.TB) *Browser {
	t.Helper()
	bin := ChromiumPath()
	if bin == "" {
		t.Fatal("testenv: no Chromium (set PUSHD_TEST_CHROMIUM, or install Debian's chromium; scripts/test does)")
	}
	args := append(append([]string(nil), chromiumFlags...), "--user-data-dir="+t.TempDir(), "about:blank")
	cmd := exec.Command(bin, args...)
	// Its own process group, so the renderers and helpers it forks are
	// stopped with it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatalf("testenv: chromium: %v", err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("testenv: start %s: %v", bin, err)
	}
	exited := make(chan struct{})
	urls := make(chan string, 1)
	var logTail tail
	// The reader owns stderr until the browser closes it at exit; it keeps
	// draining so the browser never blocks on a full pipe.
	go func() {
		defer close(exited)
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			line := sc.Text()
			logTail.add(line)
			if u, ok := strings.CutPrefix(line, "DevTools listening on "); ok {
				select {
				case urls <- strings.TrimSpace(u):
				default:
				}
			}
		}
		io.Copy(io.Discard, stderr)
		cmd.Wait()
	}()
	stop := func() {
		syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(5 * time.Second):
			syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			<-exited
		}
		// Helpers left in the group after the main process exited.
		syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	}
	select {
	case u := <-urls:
		t.Cleanup(stop)
		return &Browser{DevTools: u}
	case <-exited:
		t.Fatalf("testenv: chromium exited at start:\n%s", logTail.String())
	case <-time.After(30 * time.Second):
		stop()
		t.Fatalf("testenv: chromium did not report its DevTools address within 30s:\n%s", logTail.String())
	}
	return nil
}

// tail keeps the last lines of a log for an error message.
type tail struct {
	mu    sync.Mutex
	lines []string
}

func (t *tail) add(s string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.lines) == 20 {
		t.lines = t.lines[1:]
	}
	t.lines = append(t.lines, s)
}

func (t *tail) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return strings.Join(t.lines, "\n")
}
