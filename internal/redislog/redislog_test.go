package redislog

import (
	"context"
	"encoding/json"
	"log/slog"
	"strconv"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/pushd/pushd/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// TestDialFailuresAreOneJSONWarning dials a port nobody listens on: every
// failed dial goes through the installed logger, as JSON, and only the
// first is a warning.
func TestDialFailuresAreOneJSONWarning(t *testing.T) {
	var logs testenv.LogBuffer
	Install(slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug})))
	addr := "127.0.0.1:" + strconv.Itoa(testenv.FreePort(t)) // reserved, then closed
	c := redis.NewClient(&redis.Options{Addr: addr, DialerRetries: 1, MaxRetries: -1})
	const attempts = 5
	for range attempts {
		if err := c.Ping(context.Background()).Err(); err == nil {
			t.Fatalf("ping of %s answered", addr)
		}
	}
	c.Close()
	testenv.WaitDialRetriesEnded(t)

	var warns, debugs int
	for _, s := range strings.Split(strings.TrimSpace(logs.String()), "\n") {
		var l struct {
			Level, Msg, Component, Err string
		}
		if err := json.Unmarshal([]byte(s), &l); err != nil {
			t.Fatalf("not a JSON line: %q: %v", s, err)
		}
		if l.Component != "redis" || l.Msg != "redis dial failed" || !strings.Contains(l.Err, addr) {
			t.Errorf("line %q: want component redis, msg \"redis dial failed\" and the dial error", s)
		}
		switch l.Level {
		case "WARN":
			warns++
		case "DEBUG":
			debugs++
		}
	}
	if warns != 1 || debugs < attempts-1 {
		t.Errorf("%d failed pings logged %d warnings and %d debug lines, want 1 and at least %d:\n%s", attempts, warns, debugs, attempts-1, logs.String())
	}
}
