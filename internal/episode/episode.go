// Package episode logs a failure that repeats, such as a server that does
// not answer, as one episode: a warning when it starts, a summary at most
// every Interval while it lasts, and one line when it ends. The failures in
// between go to the debug level only, so a lost server costs a few lines,
// not one per attempt.
package episode

import (
	"log/slog"
	"sync"
	"sync/atomic"
	"time"
)

// Interval is the least time between two warnings of one episode. An
// episode with no failure for this long is over even if nothing said so
// (a caller that never sees success), and the next failure starts another.
const Interval = 30 * time.Second

// Logger logs one source's episodes. It is safe for concurrent use.
type Logger struct {
	log     *slog.Logger
	summary string
	now     func() time.Time // time.Now; tests set it

	open atomic.Bool // down, for OK's fast path: callers call it on every success

	mu       sync.Mutex
	down     bool
	start    time.Time // the episode's first failure
	lastFail time.Time
	lastLine time.Time // the last warning: the first or a summary
	since    int       // failures since lastLine
	total    int       // failures in the episode
}

// New returns a Logger writing to log. summary is the message of the
// periodic summaries, e.g. "redis still unreachable".
func New(log *slog.Logger, summary string) *Logger {
	return &Logger{log: log, summary: summary, now: time.Now}
}

// Fail records a failure. The first of an episode is logged at warn as msg
// with err and args, and Fail reports true; later ones are logged at debug,
// and, once Interval has passed since the last warning, a summary at warn
// counts them.
func (l *Logger) Fail(msg string, err error, args ...any) (first bool) {
	l.mu.Lock()
	now := l.now()
	if l.down && now.Sub(l.lastFail) >= Interval {
		l.down = false // ended unseen: this is a new one
	}
	l.open.Store(true)
	l.lastFail = now
	if !l.down {
		l.down, l.start, l.lastLine, l.since, l.total = true, now, now, 0, 1
		l.mu.Unlock()
		l.log.Warn(msg, with(args, "err", err)...)
		return true
	}
	l.since++
	l.total++
	if now.Sub(l.lastLine) < Interval {
		l.mu.Unlock()
		l.log.Debug(msg, with(args, "err", err)...)
		return false
	}
	since, downFor := l.since, round(now.Sub(l.start))
	l.lastLine, l.since = now, 0
	l.mu.Unlock()
	l.log.Warn(l.summary, with(args, "failures", since, "down_for", downFor, "err", err)...)
	return false
}

// OK ends the episode, if one is open: it logs msg at info with how long
// the episode lasted and its failures, and reports true. An episode whose
// last failure is Interval old is over already and ends silently.
func (l *Logger) OK(msg string, args ...any) bool {
	if !l.open.Load() {
		return false
	}
	l.mu.Lock()
	if !l.down {
		l.mu.Unlock()
		return false
	}
	l.down = false
	l.open.Store(false)
	now := l.now()
	total, downFor := l.total, round(now.Sub(l.start))
	expired := now.Sub(l.lastFail) >= Interval
	l.mu.Unlock()
	if expired {
		return false // it ended unseen long ago: its length is unknown
	}
	l.log.Info(msg, with(args, "failures", total, "down_for", downFor)...)
	return true
}

// with appends kv to a copy of args: the caller's slice is left alone.
func with(args []any, kv ...any) []any {
	return append(args[:len(args):len(args)], kv...)
}

func round(d time.Duration) time.Duration { return d.Round(time.Millisecond) }
