package main

import (
	"context"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"
)

// quickStartScript returns the README's quick-start shell block: the first
// sh block after the line that introduces it.
func quickStartScript(t *testing.T) string {
	t.Helper()
	return fencedBlock(t, "../../README.md", "With the\nembedded node running, in another shell:", "sh")
}

// TestReadmeQuickStartPrintsWhatItPromises runs the README's curl block,
// as written, against the built binary in the embedded mode, twice in a
// row, and checks the output the README promises, in its order: the first
// run finds task_1 missing and publishes it, the second finds it there and
// its publish is not written again. The block must wait for the
// subscription itself: run as pasted, the publish may not beat it. It
// leaves no file where it runs.
func TestReadmeQuickStartPrintsWhatItPromises(t *testing.T) {
	for _, tool := range []string{"bash", "curl", "grep", "mktemp", "sed", "tee"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("the quick start needs %s: %v", tool, err)
		}
	}
	script := quickStartScript(t)
	if !strings.Contains(script, "localhost:8080") {
		t.Fatalf("quick-start block no longer talks to localhost:8080:\n%s", script)
	}
	p := startBinary(t)
	wantHealthy(t, p.URL)
	script = strings.ReplaceAll(script, "localhost:8080", strings.TrimPrefix(p.URL, "http://"))
	// After the block: wait for the task event, then end the stream the
	// way the README says.
	script += "until grep -q '^event: task' \"$EVENTS\"; do sleep 0.1; done\nkill %1\nwait\nrm \"$EVENTS\"\n"
	dir := t.TempDir()
	run := func() string {
		ctx, cancel := context.WithTimeout(context.Background(), waitFor)
		defer cancel()
		cmd := exec.CommandContext(ctx, "bash", "-c", script)
		cmd.Dir = dir
		cmd.WaitDelay = time.Second // the background curl must not keep the pipes open
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("quick start failed: %v\n%s", err, out)
		}
		return string(out)
	}

	// hello, then not_found for task_1, then the publish's answer and the
	// task in either order (two processes write to one terminal).
	got := run()
	rest := inOrder(t, got, `event: hello`, `event: error`, `"code":"not_found"`)
	for _, want := range []string{`"written":true`, "event: task"} {
		if !strings.Contains(rest, want) {
			t.Fatalf("quick start output lacks %q after the not_found error:\n%s", want, got)
		}
	}
	if !task1AtVersion1.MatchString(rest) {
		t.Fatalf("quick start output lacks task_1 at version 1:\n%s", got)
	}

	// Again: task_1 is there from the start, and version 1 is not
	// written twice.
	got = run()
	rest = inOrder(t, got, `event: hello`, `event: task`)
	if !task1AtVersion1.MatchString(rest) || !strings.Contains(rest, `"written":false`) || strings.Contains(got, "not_found") {
		t.Fatalf("quick start run again: want task_1 at version 1 at once and the publish not written:\n%s", got)
	}
	if left, _ := os.ReadDir(dir); len(left) > 0 {
		t.Errorf("the quick start left %d files where it ran, %s first", len(left), left[0].Name())
	}
}

var task1AtVersion1 = regexp.MustCompile(`(?m)^data: \{"task_id":"task_1".*"version":1[,}]`)

// inOrder checks that got holds each of want in order and returns what
// follows the last.
func inOrder(t *testing.T, got string, want ...string) string {
	t.Helper()
	at := 0
	for _, w := range want {
		i := strings.Index(got[at:], w)
		if i < 0 {
			t.Fatalf("quick start output lacks %q after byte %d:\n%s", w, at, got)
		}
		at += i + len(w)
	}
	return got[at:]
}

// The README shows ./pushd -h as the binary prints it.
func TestReadmeShowsTheHelpAsPrinted(t *testing.T) {
	shown := fencedBlock(t, "../../README.md", "config file and how bad settings are reported:\n\n", "text")
	if want := usage(t); shown != want {
		t.Errorf("README's ./pushd -h differs from the binary's; it prints:\n%s", want)
	}
}
