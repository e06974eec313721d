package main

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pushd/pushd/internal/testenv"
)

// TestJSONLogWhileRedisIsDown is the test of record for the JSON log:
// pushd runs with --log-format json against a Redis port nobody listens
// on, until the bus has retried several times and go-redis has failed
// several dials. Every line pushd writes is JSON, durations are strings,
// and each warning about the lost Redis appears once, not once per
// attempt. It runs at the debug level, where every attempt is logged, so
// the attempts are events to wait on and every kind of line is checked.
func TestJSONLogWhileRedisIsDown(t *testing.T) {
	port := testenv.FreePort(t) // reserved, then closed: nothing listens
	p := startBinary(t, "--log-format", "json", "--log-level", "debug",
		"--redis-url", fmt.Sprintf("redis://127.0.0.1:%d/0", port), "--jwt-secret", "s",
		"--drain-timeout", "1500ms")

	// Several reconnect attempts of the bus, and several failed dials.
	const attempts = 5
	p.log.wait(t, regexp.MustCompile(`(?s)(?:"level":"DEBUG","msg":"pubsub connection lost; resubscribing".*){`+fmt.Sprint(attempts)+`}`), p.exited)
	p.log.wait(t, regexp.MustCompile(`(?s)(?:"level":"DEBUG","msg":"redis dial failed".*){`+fmt.Sprint(attempts)+`}`), p.exited)
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code := p.waitExit(t); code != 0 {
		t.Fatalf("exit code %d", code)
	}

	warnings := map[string]int{}
	var draining map[string]any
	for i, line := range strings.Split(strings.TrimSuffix(p.log.String(), "\n"), "\n") {
		var rec map[string]any
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatalf("line %d is not JSON: %q: %v", i+1, line, err)
		}
		for _, k := range []string{"timeout", "down_for", "retry_after"} {
			if v, ok := rec[k]; ok {
				if _, isString := v.(string); !isString {
					t.Errorf("line %d: %s is %v, want a duration string: %s", i+1, k, v, line)
				}
			}
		}
		switch rec["level"] {
		case "WARN", "ERROR":
			warnings[fmt.Sprint(rec["msg"])]++
		}
		if rec["msg"] == "draining" {
			draining = rec
		}
	}
	if draining == nil || draining["timeout"] != "1.5s" {
		t.Errorf("draining line %v, want timeout \"1.5s\"", draining)
	}
	for _, msg := range []string{"pubsub connection lost; resubscribing", "redis dial failed"} {
		if warnings[msg] != 1 {
			t.Errorf("%d warnings %q over at least %d attempts, want 1", warnings[msg], msg, attempts)
		}
	}
	for msg, n := range warnings {
		if n > 1 {
			t.Errorf("warning %q logged %d times, want once", msg, n)
		}
	}
	if t.Failed() {
		t.Logf("log:\n%s", p.log)
	}
}

// TestLoggerWritesDurationsAsStrings: both formats write a duration as
// time.Duration's String, at the top level and in groups.
func TestLoggerWritesDurationsAsStrings(t *testing.T) {
	for format, want := range map[string]string{
		"text": `d=1.5s g.d=2m0s`,
		"json": `"d":"1.5s","g":{"d":"2m0s"}`,
	} {
		var buf testenv.LogBuffer // safe for go-redis's goroutines: newLogger installs it for them
		log, err := newLogger(config{LogLevel: "info", LogFormat: format}, &buf)
		if err != nil {
			t.Fatal(err)
		}
		log.Info("x", "d", 1500*time.Millisecond, slog.Group("g", "d", 2*time.Minute))
		if !strings.Contains(buf.String(), want) {
			t.Errorf("%s: %q, want it to contain %s", format, buf.String(), want)
		}
	}
}
