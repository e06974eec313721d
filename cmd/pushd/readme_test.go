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
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	s := string(readme)
	i := strings.Index(s, "With the\nembedded node running, in another shell:")
	if i < 0 {
		t.Fatal("README has no quick-start curl block (the line introducing it changed?)")
	}
	s = s[i:]
	start := strings.Index(s, "```sh\n")
	end := strings.Index(s[start+len("```sh\n"):], "```")
	if start < 0 || end < 0 {
		t.Fatal("README's quick-start block is not a closed sh block")
	}
	return s[start+len("```sh\n") : start+len("```sh\n")+end]
}

// TestReadmeQuickStartPrintsWhatItPromises runs the README's curl block,
// as written, against the built binary in the embedded mode, and checks
// the output the README promises, in its order. The block must wait for
// the subscription itself: run it as pasted, the publish may not beat it.
func TestReadmeQuickStartPrintsWhatItPromises(t *testing.T) {
	for _, tool := range []string{"bash", "curl", "grep", "sed", "tee"} {
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
	script += "until grep -q '^event: task' events.txt; do sleep 0.1; done\nkill %1\nwait\n"

	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "-c", script)
	cmd.Dir = t.TempDir()
	cmd.WaitDelay = time.Second // the background curl must not keep the pipes open
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("quick start failed: %v\n%s", err, out)
	}
	got := string(out)
	// hello, then not_found for task_1, then the publish's answer and the
	// task in either order (two processes write to one terminal).
	order := []string{`event: hello`, `event: error`, `"code":"not_found"`}
	at := 0
	for _, want := range order {
		i := strings.Index(got[at:], want)
		if i < 0 {
			t.Fatalf("quick start output lacks %q after byte %d:\n%s", want, at, got)
		}
		at += i + len(want)
	}
	rest := got[at:]
	for _, want := range []string{`"written":true`, "event: task"} {
		if !strings.Contains(rest, want) {
			t.Fatalf("quick start output lacks %q after the not_found error:\n%s", want, got)
		}
	}
	if !regexp.MustCompile(`(?m)^data: \{"task_id":"task_1".*"version":1[,}]`).MatchString(rest) {
		t.Fatalf("quick start output lacks task_1 at version 1:\n%s", got)
	}
}
