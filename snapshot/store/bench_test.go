package store_test

import (
	"context"
	"testing"
	"time"

	"github.com/pushd/pushd/internal/testenv"
	"github.com/pushd/pushd/snapshot/store"
)

// cachedStore returns a Store whose process cache holds task "bench".
func cachedStore(tb testing.TB) *store.Store {
	tb.Helper()
	r := testenv.SharedRedis(tb)
	s := newStore(tb, store.Config{Redis: r.Client, Names: r.Names, CacheTTL: time.Hour})
	if _, err := s.SetIfNewer(context.Background(), testenv.Snapshot(tb, "bench", "t1", "RUNNING", 7)); err != nil {
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
