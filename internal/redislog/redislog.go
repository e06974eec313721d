// Package redislog sends go-redis's own log lines to a slog.Logger, so a
// JSON log stays JSON, and logs its repeated dial failures as one episode
// instead of a line per attempt.
package redislog

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/redis/go-redis/v9"

	"github.com/pushd/pushd/internal/episode"
)

// dialFailed starts the line go-redis's pool logs for every failed dial.
const dialFailed = "redis: connection pool: failed to dial"

var (
	installOnce sync.Once
	current     atomic.Pointer[adapter]
)

// Install makes go-redis log to log, at warn with "component":"redis".
//
// go-redis has one logger per process, and its lines do not say which
// client they are about, so no routing could give each of several nodes in
// one process its own lines. A process runs one pushd node; cmd/pushd,
// which owns the process, installs its logger once at start. A later
// Install (in-process tests that run it again) replaces the logger; other
// tests leave go-redis's default.
func Install(log *slog.Logger) {
	log = log.With("component", "redis")
	current.Store(&adapter{log: log, dial: episode.New(log, "redis still unreachable")})
	installOnce.Do(func() { redis.SetLogger(forward{}) })
}

// forward is the logger go-redis holds: it hands each line to the adapter
// installed last.
type forward struct{}

func (forward) Printf(ctx context.Context, format string, v ...any) {
	if a := current.Load(); a != nil {
		a.printf(ctx, format, v...)
	}
}

type adapter struct {
	log  *slog.Logger
	dial *episode.Logger
}

func (a *adapter) printf(ctx context.Context, format string, v ...any) {
	if strings.HasPrefix(format, dialFailed) {
		// The pool logs every failed dial, several a second while a server
		// is down; the error is its last argument.
		var err error
		if len(v) > 0 {
			err, _ = v[len(v)-1].(error)
		}
		if err == nil {
			err = fmt.Errorf(format, v...)
		}
		a.dial.Fail("redis dial failed", err)
		return
	}
	a.log.WarnContext(ctx, strings.TrimPrefix(fmt.Sprintf(format, v...), "redis: "))
}
