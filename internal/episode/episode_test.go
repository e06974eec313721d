package episode

import (
	"bytes"
	"encoding/json"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"
)

// clock is a manual clock for the Logger under test.
type clock struct{ t time.Time }

func (c *clock) now() time.Time      { return c.t }
func (c *clock) add(d time.Duration) { c.t = c.t.Add(d) }
func newTest(level slog.Level) (*Logger, *clock, *bytes.Buffer) {
	var buf bytes.Buffer
	c := &clock{t: time.Unix(1_700_000_000, 0)}
	l := New(slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: level})), "redis still unreachable")
	l.now = c.now
	return l, c, &buf
}

type line struct {
	Level    string  `json:"level"`
	Msg      string  `json:"msg"`
	Err      string  `json:"err"`
	Failures int     `json:"failures"`
	DownFor  float64 `json:"down_for"` // nanoseconds: this handler has no ReplaceAttr
	Source   string  `json:"source"`
}

func lines(t *testing.T, buf *bytes.Buffer) []line {
	t.Helper()
	var out []line
	for _, s := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
		if s == "" {
			continue
		}
		var l line
		if err := json.Unmarshal([]byte(s), &l); err != nil {
			t.Fatalf("%q: %v", s, err)
		}
		out = append(out, l)
	}
	buf.Reset()
	return out
}

func TestEpisodeWarnsOnceThenSummarisesThenEnds(t *testing.T) {
	l, c, buf := newTest(slog.LevelInfo)
	errDown := errors.New("connection refused")

	if !l.Fail("redis lost", errDown, "source", "bus") {
		t.Fatal("the first failure did not start an episode")
	}
	for range 20 { // three a second, well within Interval
		c.add(300 * time.Millisecond)
		if l.Fail("redis lost", errDown, "source", "bus") {
			t.Fatal("a repeated failure started another episode")
		}
	}
	got := lines(t, buf)
	if len(got) != 1 || got[0].Level != "WARN" || got[0].Msg != "redis lost" || got[0].Err != "connection refused" || got[0].Source != "bus" {
		t.Fatalf("21 failures within %v logged %+v, want one warning", Interval, got)
	}

	c.add(Interval - 20*300*time.Millisecond) // Interval since the first warning
	l.Fail("redis lost", errDown, "source", "bus")
	got = lines(t, buf)
	want := line{Level: "WARN", Msg: "redis still unreachable", Err: "connection refused", Failures: 21, DownFor: float64(Interval), Source: "bus"}
	if len(got) != 1 || got[0] != want {
		t.Fatalf("after %v logged %+v, want %+v", Interval, got, want)
	}

	c.add(time.Second)
	if !l.OK("redis answers again", "source", "bus") {
		t.Fatal("OK found no episode")
	}
	got = lines(t, buf)
	want = line{Level: "INFO", Msg: "redis answers again", Failures: 22, DownFor: float64(Interval + time.Second), Source: "bus"}
	if len(got) != 1 || got[0] != want {
		t.Fatalf("OK logged %+v, want %+v", got, want)
	}
	if l.OK("redis answers again") {
		t.Error("a second OK found an episode")
	}
	if got := lines(t, buf); len(got) != 0 {
		t.Errorf("OK without an episode logged %+v", got)
	}
}

func TestEpisodeRepeatsGoToDebug(t *testing.T) {
	l, c, buf := newTest(slog.LevelDebug)
	l.Fail("redis lost", errors.New("refused"))
	c.add(time.Second)
	l.Fail("redis lost", errors.New("refused"))
	got := lines(t, buf)
	if len(got) != 2 || got[0].Level != "WARN" || got[1].Level != "DEBUG" || got[1].Msg != "redis lost" {
		t.Fatalf("logged %+v, want a warning then a debug line", got)
	}
}

func TestEpisodeEndsUnseenAfterAQuietInterval(t *testing.T) {
	l, c, buf := newTest(slog.LevelInfo)
	l.Fail("dial failed", errors.New("refused"))
	c.add(Interval) // no failure, and no OK: the caller cannot see success
	if !l.Fail("dial failed", errors.New("refused again")) {
		t.Fatal("a failure after a quiet Interval did not start a new episode")
	}
	got := lines(t, buf)
	if len(got) != 2 || got[1].Msg != "dial failed" || got[1].Err != "refused again" {
		t.Fatalf("logged %+v, want the new episode's warning", got)
	}
}

func TestEpisodeOKAfterAQuietIntervalIsSilent(t *testing.T) {
	l, c, buf := newTest(slog.LevelInfo)
	l.Fail("read failed", errors.New("refused"))
	lines(t, buf)
	c.add(time.Hour) // no reads for an hour: when it ended is unknown
	if l.OK("reads answer again") {
		t.Error("OK reported the end of an episode that ended unseen")
	}
	if got := lines(t, buf); len(got) != 0 {
		t.Errorf("OK logged %+v, want nothing", got)
	}
}

func TestEpisodeLeavesCallersArgsAlone(t *testing.T) {
	l, _, _ := newTest(slog.LevelInfo)
	args := make([]any, 2, 8)
	args[0], args[1] = "source", "bus"
	l.Fail("lost", errors.New("x"), args...)
	if got := args[:cap(args)][2]; got != nil {
		t.Errorf("Fail wrote %v into the caller's slice", got)
	}
}
