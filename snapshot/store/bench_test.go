package store_test

import (
	"context"
	"syscall"
	"testing"
	"time"

	"github.com/pushd/pushd/internal/testenv"
	"github.com/pushd/pushd/snapshot/snapshottest"
	"github.com/pushd/pushd/snapshot/store"
)

// cachedStore returns a Store whose process cache holds task "bench".
func cachedStore(tb testing.TB) *store.Store {
	tb.Helper()
	r := testenv.SharedRedis(tb)
	s := newStore(tb, store.Config{Redis: r.Client, Names: r.Names, CacheTTL: time.Hour})
	if _, err := s.SetIfNewer(context.Background(), snapshottest.Snapshot(tb, "bench", "t1", "RUNNING", 7)); err != nil {
		tb.Fatal(err)
	}
	return s
}

func BenchmarkGetCacheHit(b *testing.B) {
	s := cachedStore(b)
	ctx := context.Background()
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := s.Get(ctx, "bench", 7); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// uncachedStore returns a Store without a process cache, so every Get of
// task "bench" reads Redis. The task has succeeded: a running task's
// snapshot expires from Redis after 10 s, sooner than a benchmark with
// -count runs.
func uncachedStore(tb testing.TB) *store.Store {
	tb.Helper()
	r := testenv.SharedRedis(tb)
	s := store.New(store.Config{Redis: r.Client, Names: r.Names, CacheTTL: -1})
	tb.Cleanup(s.Close)
	if _, err := s.SetIfNewer(context.Background(), snapshottest.Snapshot(tb, "bench", "t1", "SUCCEEDED", 7)); err != nil {
		tb.Fatal(err)
	}
	return s
}

// BenchmarkGetRedis is a read of an announced version from Redis: the
// hub's read for every notification (a context that never ends, so the
// caller leads the flight on its own goroutine) and a subscriber's (one
// that may end, so the flight runs on a goroutine of its own).
func BenchmarkGetRedis(b *testing.B) {
	s := uncachedStore(b)
	cancellable, cancel := context.WithCancel(context.Background())
	defer cancel()
	for _, bc := range []struct {
		name string
		ctx  context.Context
	}{{"notification", context.Background()}, {"subscriber", cancellable}} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			start := cpuTime()
			for b.Loop() {
				if _, err := s.Get(bc.ctx, "bench", 7); err != nil {
					b.Fatal(err)
				}
			}
			// The round trip's wait dominates ns/op; what the read costs
			// the node is its CPU time (Redis's own is not in it).
			b.ReportMetric(float64(cpuTime()-start)/float64(b.N), "cpu-ns/op")
		})
	}
}

// cpuTime is the process's user and system CPU time so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
