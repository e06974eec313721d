package main

import (
	"context"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// pushdVersion runs `pushd version` from the binary at path.
func pushdVersion(t *testing.T, path string, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	cmd := exec.CommandContext(ctx, path, append([]string{"version"}, args...)...)
	cmd.Env = envWithoutPushd()
	out, err := cmd.CombinedOutput()
	return string(out), err
}

func TestBinaryVersionNamesTheCommit(t *testing.T) {
	out, err := pushdVersion(t, binary(t))
	if err != nil {
		t.Fatalf("pushd version: %v\n%s", err, out)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) < 3 || !strings.HasPrefix(lines[0], "pushd ") || len(lines[0]) == len("pushd ") || !strings.HasPrefix(lines[1], "commit ") {
		t.Fatalf("pushd version printed:\n%s", out)
	}
	if out, err := pushdVersion(t, binary(t), "extra"); err == nil || !strings.Contains(out, "version takes no arguments") {
		t.Errorf("pushd version extra: %v\n%s", err, out)
	}
}

// TestBinaryVersionFromTheBuild builds the binary as a release is built:
// the version and commit set with -X (the Dockerfile's way, having no .git),
// or the commit stamped by go build from the checkout. Only the link step
// differs from the cached build, so this costs seconds.
func TestBinaryVersionFromTheBuild(t *testing.T) {
	gotool, err := exec.LookPath("go")
	if err != nil {
		t.Fatal(err)
	}
	build := func(t *testing.T, args ...string) string {
		t.Helper()
		path := filepath.Join(t.TempDir(), "pushd")
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, gotool, append(append([]string{"build"}, args...), "-o", path, ".")...)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("go build: %v\n%s", err, out)
		}
		return path
	}

	t.Run("ldflags", func(t *testing.T) {
		path := build(t, "-ldflags", "-s -w -X main.version=v1.2.3-test -X main.commit=0123abcd")
		if out, err := pushdVersion(t, path); err != nil || !strings.HasPrefix(out, "pushd v1.2.3-test\ncommit 0123abcd\n") {
			t.Fatalf("pushd version: %v\n%s", err, out)
		}
	})
	t.Run("vcs", func(t *testing.T) {
		head, err := exec.Command("git", "rev-parse", "HEAD").Output()
		if err != nil {
			// The suite runs from a clone; a skip here would count as a pass.
			t.Fatalf("no git checkout to stamp the version from: %v", err)
		}
		// -buildvcs=true overrides a GOFLAGS=-buildvcs=false in the environment.
		out, err := pushdVersion(t, build(t, "-buildvcs=true"))
		if want := "\ncommit " + strings.TrimSpace(string(head)); err != nil || !strings.Contains(out, want) {
			t.Fatalf("pushd version: %v\n%s\nwant %q", err, out, want)
		}
	})
}
