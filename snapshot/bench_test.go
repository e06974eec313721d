package snapshot_test

import (
	"context"
	"testing"
	"time"

	"github.com/pushd/pushd/snapshot"
	"github.com/pushd/pushd/testenv"
)

// cachedStore returns a Store whose process cache holds task "bench".
func cachedStore(tb testing.TB) *snapshot.Store {
	tb.Helper()
	r := testenv.SharedRedis(tb)
	s := newStore(tb, snapshot.Config{Redis: r.Client, Names: r.Names, CacheTTL: time.Hour})
	if _, err := s.SetIfNewer(context.Background(), snap(tb, "bench", "t1", "RUNNING", 7)); err != nil {
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

func BenchmarkParse(b *testing.B) {
	in := []byte(`{"task_id":"task_123","tenant_id":"t1","project_id":"p1","user_id":"u1",` +
		`"status":"RUNNING","progress":45,"stage":"provider_generating","provider":"veo","model":"veo-3",` +
		`"queue_position":12,"preview_asset_id":null,"output_asset_id":null,"error_code":null,` +
		`"version":18,"updated_at":1710000000000}`)
	b.ReportAllocs()
	b.SetBytes(int64(len(in)))
	for b.Loop() {
		if _, err := snapshot.Parse(in); err != nil {
			b.Fatal(err)
		}
	}
}
