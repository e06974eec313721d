package admission

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/redis/go-redis/v9"
)

// errorStats reads INFO errorstats of one node: error prefix -> count.
func (e *clusterEnv) errorStats(t *testing.T, addr string) map[string]int {
	t.Helper()
	info, err := e.direct[addr].Info(context.Background(), "errorstats").Result()
	if err != nil {
		t.Fatalf("%s: INFO errorstats: %v", addr, err)
	}
	out := make(map[string]int)
	for _, line := range strings.Split(info, "\n") {
		// errorstat_NOSCRIPT:count=3
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":count=")
		if !ok || !strings.HasPrefix(name, "errorstat_") {
			continue
		}
		n, err := strconv.Atoi(rest)
		if err != nil {
			t.Fatalf("%s: %q: %v", addr, line, err)
		}
		out[strings.TrimPrefix(name, "errorstat_")] = n
	}
	return out
}

// checkNoErrors: no node answered CROSSSLOT, no command failed or was
// refused but EVALSHA's NOSCRIPT for a script not loaded yet, and no node
// failed a round trip. (Redis 7.0 also counts, as ERR of no command, the
// CLIENT subcommands it does not know that go-redis sends on each new
// connection; the command stats tell them apart.)
func (e *clusterEnv) checkNoErrors(t *testing.T) {
	t.Helper()
	for _, s := range e.rc.Nodes {
		errs := e.errorStats(t, s.Addr)
		if n := errs["CROSSSLOT"]; n > 0 {
			t.Errorf("%s answered CROSSSLOT %d times", s.Addr, n)
		}
		for kind, n := range errs {
			if kind != "NOSCRIPT" && kind != "ERR" && kind != "CROSSSLOT" {
				t.Errorf("%s answered %s %d times", s.Addr, kind, n)
			}
		}
		cmds := e.commandStats(t, s.Addr)
		for cmd, st := range cmds {
			if st.rejected > 0 || st.failed > 0 && cmd != "evalsha" {
				t.Errorf("%s: %s refused %d and failed %d calls", s.Addr, cmd, st.rejected, st.failed)
			}
		}
		if n := cmds["evalsha"].failed; n != errs["NOSCRIPT"] {
			t.Errorf("%s: %d EVALSHA failed, %d of them NOSCRIPT", s.Addr, n, errs["NOSCRIPT"])
		}
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	for i, c := range e.nodes {
		if n, f := c.Stats().StoreErrors, c.Stats().Fallbacks; n != 0 || f != 0 {
			t.Errorf("node %d: %d failed round trips, %d local decisions", i, n, f)
		}
	}
	for _, r := range e.logs.failures() {
		t.Errorf("logged: %s", r)
	}
}

type commandStat struct{ calls, rejected, failed int }

// commandStats reads INFO commandstats of one node: command -> its calls,
// and those refused (before running) and failed (while running).
func (e *clusterEnv) commandStats(t *testing.T, addr string) map[string]commandStat {
	t.Helper()
	info, err := e.direct[addr].Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatalf("%s: INFO commandstats: %v", addr, err)
	}
	out := make(map[string]commandStat)
	for _, line := range strings.Split(info, "\n") {
		// cmdstat_evalsha:calls=41,usec=2471,usec_per_call=60.27,rejected_calls=0,failed_calls=6
		name, fields, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || !strings.HasPrefix(name, "cmdstat_") {
			continue
		}
		var st commandStat
		for _, f := range strings.Split(fields, ",") {
			k, v, _ := strings.Cut(f, "=")
			switch k {
			case "calls":
				st.calls, err = strconv.Atoi(v)
			case "rejected_calls":
				st.rejected, err = strconv.Atoi(v)
			case "failed_calls":
				st.failed, err = strconv.Atoi(v)
			}
			if err != nil {
				t.Fatalf("%s: %q: %v", addr, line, err)
			}
		}
		out[strings.TrimPrefix(name, "cmdstat_")] = st
	}
	return out
}

// logRecorder is a slog.Handler that keeps the records of failed round
// trips, and any record that names CROSSSLOT.
type logRecorder struct {
	mu   sync.Mutex // guards recs
	recs []string
}

func (l *logRecorder) Enabled(context.Context, slog.Level) bool { return true }
func (l *logRecorder) WithAttrs([]slog.Attr) slog.Handler       { return l }
func (l *logRecorder) WithGroup(string) slog.Handler            { return l }

func (l *logRecorder) Handle(_ context.Context, r slog.Record) error {
	var b strings.Builder
	b.WriteString(r.Message)
	r.Attrs(func(a slog.Attr) bool {
		fmt.Fprintf(&b, " %s=%v", a.Key, a.Value)
		return true
	})
	s := b.String()
	if strings.Contains(s, "store failed") || strings.Contains(s, "CROSSSLOT") {
		l.mu.Lock()
		l.recs = append(l.recs, s)
		l.mu.Unlock()
	}
	return nil
}

func (l *logRecorder) failures() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.recs...)
}

// declaredKeysOnly makes, for the test, every script fail with an
// UNDECLARED error when it calls a command on a key it was not given in
// KEYS: Redis Cluster requires it, and Redis itself does not check it
// within one slot. The scripts are the package's own, with each
// redis.call routed through the check.
func declaredKeysOnly(t *testing.T) {
	t.Helper()
	const check = `local declared = {}
for _, k in ipairs(KEYS) do declared[k] = true end
local function call(cmd, ...)
  local key = ...
  if cmd ~= 'TIME' and not declared[key] then
    error({err = 'UNDECLARED ' .. cmd .. ' ' .. tostring(key)})
  end
  return redis.call(cmd, ...)
end
`
	scripts := []struct {
		v   **redis.Script
		src string
	}{
		{&bucketScript, bucketLua}, {&windowScript, windowLua}, {&acquireScript, acquireLua},
		{&releaseScript, releaseLua}, {&renewScript, renewLua}, {&reconcileScript, reconcileLua},
	}
	saved := make([]*redis.Script, len(scripts))
	for i, s := range scripts {
		if !strings.Contains(s.src, "redis.call(") || strings.Contains(s.src, "redis.pcall(") {
			t.Fatalf("script %d: no redis.call to check, or a redis.pcall the check misses", i)
		}
		saved[i] = *s.v
		*s.v = redis.NewScript(check + strings.ReplaceAll(s.src, "redis.call(", "call("))
	}
	t.Cleanup(func() {
		for i, s := range scripts {
			*s.v = saved[i]
		}
	})
}
