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

// The hub reads what each notification announced with a context that
// never ends: the read runs on the caller's goroutine and allocates no
// channel, flight goroutine or cancellable context of its own, which a
// subscriber's read (whose context may end) does.
func TestGetRedisOnTheCallersGoroutineAllocs(t *testing.T) {
	s := uncachedStore(t)
	cancellable, cancel := context.WithCancel(context.Background())
	defer cancel()
	get := func(ctx context.Context) func() {
		return func() {
			if got, err := s.Get(ctx, "bench", 7); err != nil || got.Version != 7 {
				t.Fatalf("Get = %v, %v", got, err)
			}
		}
	}
	inline := testing.AllocsPerRun(200, get(context.Background()))
	flight := testing.AllocsPerRun(200, get(cancellable))
	t.Logf("allocations per Redis read: %v on the caller's goroutine, %v on a flight's own", inline, flight)
	if inline > flight-2 {
		t.Errorf("a read with a context that never ends allocates %v times, a subscriber's %v: want at least the channel and its goroutine's closure fewer", inline, flight)
	}
}
