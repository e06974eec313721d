//go:build !race

// The race detector changes what allocates (sync.Pool drops items on
// purpose), so allocation guards run without it: scripts/test runs them in
// a step of their own.

package store_test

import (
	"context"
	"testing"
)

// A cache hit is the path every notification and poll takes on every node:
// it must not allocate.
func TestGetCacheHitAllocs(t *testing.T) {
	s := cachedStore(t)
	ctx := context.Background()
	allocs := testing.AllocsPerRun(1000, func() {
		if got, err := s.Get(ctx, "bench", 7); err != nil || got.Version != 7 {
			t.Fatalf("Get = %v, %v", got, err)
		}
	})
	if allocs != 0 {
		t.Errorf("a cache hit allocates %v times, want 0", allocs)
	}
	if st := s.Stats(); st.RedisReads != 0 {
		t.Errorf("stats %+v, want every Get from the cache", st)
	}
}
