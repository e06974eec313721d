package store_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pushd/pushd/internal/testenv"
	"github.com/pushd/pushd/snapshot"
	"github.com/pushd/pushd/snapshot/store"
)

// TestReadMissingAWriteBackReadsRedisAgain: a read that missed a task in
// Redis just before another read wrote it back there from PostgreSQL (its
// row, or its absence), and then waited (for the CPU, on a busy node) until
// the other read's cached copy expired, reads Redis again, not
// PostgreSQL. A reconnect storm against a cold Redis read 101 rows for 100
// tasks that way (node's TestReconnectStormWithColdRedisQueriesEachTaskOnce).
func TestReadMissingAWriteBackReadsRedisAgain(t *testing.T) {
	t.Parallel()
	reads := []struct {
		name string
		read func(*store.Store, string) (*snapshot.Snapshot, error)
	}{
		// The hub's reads: a context that never ends keeps them out of the
		// callers' flight, which the other read below leads.
		{"Get", func(s *store.Store, id string) (*snapshot.Snapshot, error) {
			snap, err := s.Get(context.Background(), id, 0)
			if errors.Is(err, snapshot.ErrNotFound) {
				return nil, nil
			}
			return snap, err
		}},
		{"GetMany", func(s *store.Store, id string) (*snapshot.Snapshot, error) {
			got, err := s.GetMany(context.Background(), []string{id})
			return got[id], err
		}},
	}
	for _, rd := range reads {
		for _, absent := range []bool{false, true} {
			name := rd.name + "/row"
			if absent {
				name = rd.name + "/absent"
			}
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				e := newEnv(t, store.Config{CacheTTL: 50 * time.Millisecond})
				id := testenv.UniqueID("task")
				if !absent {
					e.insert(t, id, "RUNNING", 1) // PostgreSQL only: Redis is cold
				}
				held, resume := make(chan struct{}), make(chan struct{})
				var misses atomic.Int32
				store.OnRedisMissed(e.store, func() {
					if misses.Add(1) == 1 { // the first read's miss
						close(held)
						<-resume
					}
				})
				type result struct {
					snap *snapshot.Snapshot
					err  error
				}
				first := make(chan result, 1)
				go func() {
					snap, err := rd.read(e.store, id)
					first <- result{snap, err}
				}()
				<-held

				// Another read queries PostgreSQL and writes what it found
				// back to Redis; its cached copy expires while the first
				// read waits.
				other, err := e.store.Get(testenv.Context(t), id, 0)
				if absent && !errors.Is(err, snapshot.ErrNotFound) || !absent && (err != nil || other.Version != 1) {
					t.Fatalf("the other read: %v, %v", other, err)
				}
				testenv.Eventually(t, "the cached copy expired", func() bool {
					return e.store.Cached(id) == nil && !store.CachedAbsent(e.store, id)
				})

				close(resume)
				r := <-first
				if r.err != nil || absent && r.snap != nil || !absent && (r.snap == nil || r.snap.Version != 1) {
					t.Fatalf("the first read: %v, %v; want version 1, or nothing for a task absent", r.snap, r.err)
				}
				st := e.store.Stats()
				if rows := st.DBHits + st.DBMisses; st.DBQueries != 1 || rows != 1 {
					t.Errorf("%d PostgreSQL queries answering for %d tasks, want the task read once (stats %+v)", st.DBQueries, rows, st)
				}
				if again := st.RedisHits + st.RedisNegative; again != 1 {
					t.Errorf("Redis answered %d reads, want the first read's second (stats %+v)", again, st)
				}
			})
		}
	}
}
