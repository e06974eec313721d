package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/pushd/pushd/snapshot"
	"golang.org/x/sync/singleflight"
)

// Get returns the task's snapshot: from the in-process cache when it holds
// version atLeast or newer, else from one fetch shared by every concurrent
// caller for the task (Redis, then PostgreSQL). A result older than atLeast
// means Redis lost a write, so Get then reads PostgreSQL once more.
func (s *Store) Get(ctx context.Context, taskID string, atLeast int64) (*snapshot.Snapshot, error) {
	if !snapshot.ValidID(taskID) {
		return nil, snapshot.ErrInvalidID
	}
	// A subscriber's read (atLeast 0) may come after the notification of
	// the task's newest version was heard and before it was watched: it
	// must answer with that version, not one cached or fetched before it.
	if v, ok := s.observed.get(taskID); ok && v > atLeast {
		atLeast = v
	}
	if snap, ok := s.tasks.get(taskID); ok && snap.Version >= atLeast {
		s.stats.cacheHits.Add(1)
		return snap, nil
	}
	// A notification (atLeast > 0) proves the task exists now, whatever was
	// cached about it before.
	if atLeast <= 0 {
		if _, ok := s.missing.get(taskID); ok {
			s.stats.negativeHits.Add(1)
			return nil, snapshot.ErrNotFound
		}
	}
	s.stats.cacheMisses.Add(1)
	// The hub delivering what a notification announced shares no flight
	// with callers that can give up (a herd of new connections' initial
	// reads), whose queries wait for their own share of PostgreSQL (query).
	caller, key := canGiveUp(ctx), taskID
	if !caller {
		key = deliveryFlight + taskID
	}
	fetch := func(dbOnly bool) func(context.Context) (*snapshot.Snapshot, error) {
		return func(ctx context.Context) (*snapshot.Snapshot, error) {
			return s.fetch(ctx, taskID, atLeast, dbOnly, caller)
		}
	}
	snap, err := shared(ctx, s, &s.flights, key, fetch(false))
	if atLeast <= 0 || (err == nil && snap.Version >= atLeast) {
		return snap, err
	}
	if err != nil && !errors.Is(err, snapshot.ErrNotFound) {
		return nil, err
	}
	// The flight this call joined may have started before the announced
	// version was written. One that starts now cannot have: the write
	// happened before the notification that brought us here. Read Redis
	// again before troubling PostgreSQL, which may lag Redis.
	if again, err2 := shared(ctx, s, &s.flights, key, fetch(false)); err2 == nil {
		snap, err = newest(snap, again), nil
		if snap.Version >= atLeast {
			return snap, nil
		}
	}
	// Redis lost the write (evicted, or restarted empty): ask PostgreSQL,
	// the fact source.
	if s.db != nil {
		if row, err3 := shared(ctx, s, &s.dbFlights, key, fetch(true)); err3 == nil {
			snap, err = newest(snap, row), nil
		}
	}
	// The newest version found, even if older than announced: delivering
	// it is better than nothing, and the next change or resync brings the
	// rest.
	return snap, err
}

// canGiveUp reports whether ctx can end: a caller that may give up (a
// connection's initial reads, the API, a poll), not the hub reading what a
// notification announced, whose context never ends.
func canGiveUp(ctx context.Context) bool { return ctx.Done() != nil }

// deliveryFlight prefixes the flight keys of deliveries' reads, which no
// task id holds (ValidID).
const deliveryFlight = "\x00"

// newest returns the newer of two snapshots, either of which may be nil.
func newest(a, b *snapshot.Snapshot) *snapshot.Snapshot {
	if a == nil || (b != nil && b.NewerThan(a.Version)) {
		return b
	}
	return a
}

// shared runs fetch once for every concurrent caller with the same key in g.
// The fetch runs detached from ctx, under FetchTimeout, so a caller that
// gives up does not fail the others; each caller still returns when its own
// ctx ends. A failed fetch is forgotten at once, so the next caller retries.
func shared[T any](ctx context.Context, s *Store, g *singleflight.Group, key string, fetch func(context.Context) (T, error)) (T, error) {
	// led is written by the fetch, which runs only for the caller that
	// started the flight, before its result is handed to the others.
	led := false
	run := func() (any, error) {
		led = true
		if !s.enter() {
			g.Forget(key)
			return nil, errClosed
		}
		defer s.inflight.Done()
		fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.cfg.FetchTimeout)
		defer cancel()
		v, err := fetch(fctx)
		if err != nil {
			g.Forget(key)
			return nil, err
		}
		return v, nil
	}
	var zero T
	var r singleflight.Result
	if !canGiveUp(ctx) {
		// A caller that never gives up (the hub reading what a notification
		// announced) leads the flight on its own goroutine: a goroutine per
		// read, growing its stack through the Redis client's calls, cost
		// about a tenth of a node's CPU at light load.
		r.Val, r.Err, _ = g.Do(key, run)
	} else {
		select {
		case r = <-g.DoChan(key, run):
		case <-ctx.Done():
			return zero, ctx.Err()
		}
	}
	if !led {
		s.stats.sharedCalls.Add(1)
	}
	if r.Err != nil {
		return zero, r.Err
	}
	return r.Val.(T), nil
}

// fetch reads one task for a shared flight. dbOnly skips Redis, whose copy
// was older than atLeast. atLeast > 0 also skips the negative caches.
func (s *Store) fetch(ctx context.Context, id string, atLeast int64, dbOnly, caller bool) (*snapshot.Snapshot, error) {
	// A caller that missed the cache just before the previous flight for
	// this task stored its result may start a new flight just after: answer
	// it from the cache, so a burst of callers costs one read.
	if snap, ok := s.tasks.get(id); ok && snap.Version >= atLeast {
		s.stats.cacheHits.Add(1)
		return snap, nil
	}
	if atLeast <= 0 {
		if _, ok := s.missing.get(id); ok {
			s.stats.negativeHits.Add(1)
			return nil, snapshot.ErrNotFound
		}
	}

	var redisErr error // why Redis did not answer, if it did not
	var redisAt int64  // when the Redis read that missed began; 0 for none
	if s.rdb != nil && !dbOnly {
		at := monotime()
		snap, answered, err := s.fromRedis(ctx, id, atLeast, caller)
		if answered {
			return snap, err
		}
		if redisErr = err; err == nil {
			redisAt = at
			if s.missedRedis != nil {
				s.missedRedis()
			}
		}
	}
	if s.db == nil {
		return nil, unavailable(id, redisErr)
	}

	// dbOnly: Redis was older than announced, so only a read sent from now
	// on will do.
	res, err := s.readDB(ctx, []string{id}, atLeast, !dbOnly, caller, redisAt)
	if len(res.again) > 0 { // its one id: nothing registered, nothing read
		// Another read wrote the task back to Redis after ours began: read
		// it there. Only if Redis has lost it since is PostgreSQL asked.
		snap, answered, rerr := s.fromRedis(ctx, id, atLeast, caller)
		if answered {
			return snap, rerr
		}
		redisErr = rerr
		res, err = s.readDB(ctx, []string{id}, atLeast, !dbOnly, caller, 0)
	}
	defer res.release() // once cached and written back
	if err != nil {
		return nil, unavailable(id, errors.Join(redisErr, err))
	}
	snap := res.found[id]
	if len(res.rows)+len(res.absent) == 0 {
		// Another read's (which caches and writes it back), or the cache's.
		if snap == nil {
			return nil, snapshot.ErrNotFound
		}
		return s.cachedIfNewer(snap), nil
	}
	// Redis missed, lost a write, or was skipped: tell it what PostgreSQL
	// said. Not after a Redis error: Redis is likely down, and waiting on it
	// again would only delay the answer.
	toRedis := s.rdb != nil && redisErr == nil && s.redisWritable(ctx, res.ids)
	kept := s.keep(ctx, res, toRedis)
	if snap == nil {
		return nil, snapshot.ErrNotFound
	}
	return kept[id], nil
}

// fromRedis reads the task from Redis for fetch. answered reports that
// Redis settled the read, with snap or ErrNotFound; if it did not,
// PostgreSQL is asked, and err says why Redis did not answer (nil for a
// miss).
func (s *Store) fromRedis(ctx context.Context, id string, atLeast int64, caller bool) (snap *snapshot.Snapshot, answered bool, err error) {
	read := s.readRedis
	if caller {
		read = s.askRedis // a herd's reads share round trips
	}
	snap, missing, err := read(ctx, id, atLeast <= 0 && s.cfg.NegativeTTL > 0)
	s.redisRead(ctx, err, "task_id", id)
	switch {
	case err != nil:
		return nil, false, err
	case snap != nil:
		return s.remember(snap), true, nil
	case missing:
		s.stats.negativeHits.Add(1)
		s.stats.redisNegative.Add(1)
		s.markMissing(id)
		return nil, true, snapshot.ErrNotFound
	case s.db == nil:
		// Redis is the only source and does not have the task.
		return nil, true, snapshot.ErrNotFound
	}
	return nil, false, nil
}

// keep caches what res's own query read, for the ids other reads added to
// it too, and caches the absences. With toRedis it writes the rows back to
// Redis; without, each row stands in for the Redis copy for standInTTL.
// It returns each row as cached: the newer of it and the cache's.
func (s *Store) keep(ctx context.Context, res *dbResult, toRedis bool) map[string]*snapshot.Snapshot {
	kept := make(map[string]*snapshot.Snapshot, len(res.rows))
	if toRedis && len(res.rows) > 0 {
		s.writeBack(ctx, res.rows)
	}
	for _, row := range res.rows {
		if toRedis {
			kept[row.TaskID] = s.remember(row)
		} else {
			kept[row.TaskID] = s.rememberFor(row, standInTTL)
		}
	}
	s.setMissing(ctx, res.absent, toRedis)
	return kept
}

// unavailable wraps ErrUnavailable with what caused it.
func unavailable(id string, cause error) error {
	if cause == nil {
		return fmt.Errorf("get %s: %w: no source configured", id, snapshot.ErrUnavailable)
	}
	return fmt.Errorf("get %s: %w: %w", id, snapshot.ErrUnavailable, cause)
}

// standInTTL is how long a row read from PostgreSQL stays in process when
// Redis could not take its write-back (it failed a moment ago): the cached
// copy stands in for the Redis copy, so a storm of readers of the task
// while Redis is skipped costs one query, not one per CacheTTL. A change
// announced meanwhile drops it (Observe), and polling bypasses it.
const standInTTL = 3 * redisBackoff

// remember caches snap unless the cache holds a newer version, and returns
// the newer of the two: a source that lags behind what this node already saw
// must not move the node backwards. Where the cache keeps only the newer
// version (a remnant of an expired entry), snap is returned as read and not
// cached; each connection's own versions keep it from going backwards there.
func (s *Store) remember(snap *snapshot.Snapshot) *snapshot.Snapshot { return s.rememberFor(snap, 0) }

// Remember caches snap, a version its caller stored in Redis itself (a
// repair of package converge publishes through the node's publisher, not
// the Store), unless the cache holds a newer one, and returns the newer of
// the two, as a read would: the reads the version's hint causes here then
// find it in process.
func (s *Store) Remember(snap *snapshot.Snapshot) *snapshot.Snapshot { return s.remember(snap) }

// rememberFor is remember with the entry kept for at least ttl.
func (s *Store) rememberFor(snap *snapshot.Snapshot, ttl time.Duration) *snapshot.Snapshot {
	newest := s.tasks.updateFor(snap.TaskID, ttl, func(old *snapshot.Snapshot, present bool) (*snapshot.Snapshot, bool) {
		if present && old.Version > snap.Version {
			return old, false
		}
		return snap, true
	})
	if isRemnant(newest) {
		newest = snap
	} else if newest == snap && s.tasks.ttl > 0 {
		s.stats.cacheSets.Add(1)
	}
	// A read sent before a newer version was announced (Observe) is not
	// the task's state now: the reads that trust the cache (GetMany, a
	// refresh) must not answer it for the cache's lifetime. Checked after
	// the update, so an Observe either dropped the entry already or is seen
	// here.
	if v, ok := s.observed.get(snap.TaskID); ok && newest == snap && snap.Version < v {
		s.tasks.delete(snap.TaskID)
	}
	// After the update, so a concurrent markMissing either sees the task or
	// has its entry deleted here: tasks are never deleted, so existence wins.
	s.missing.delete(snap.TaskID)
	return newest
}

// Cached returns the snapshot Get(taskID, 0) would answer from the
// in-process cache, without Redis or PostgreSQL, or nil. A cached absence
// is nil too: the hub spares a read only of a task its reader sees, and a
// task of another tenant must cost what an absent one costs.
func (s *Store) Cached(taskID string) *snapshot.Snapshot {
	snap, _ := s.tasks.get(taskID)
	return snap
}

// Observe records that a notification announced version of the task: a
// cached copy older than that and a cached "not found" are dropped, so the
// next read goes to Redis. The hub calls it for every notification, watched
// or not, so a connection that subscribes later never starts from a copy
// this node knows is stale. It does no I/O.
func (s *Store) Observe(taskID string, version int64) {
	raise(s.observed, taskID, version)
	if snap, ok := s.tasks.get(taskID); ok && snap.Version < version {
		s.tasks.delete(taskID)
	}
	s.missing.delete(taskID)
}

// markMissing caches "not found" in process, unless this node meanwhile
// learned of the task.
func (s *Store) markMissing(id string) {
	s.missing.put(id, struct{}{})
	if _, ok := s.tasks.get(id); ok {
		s.missing.delete(id)
	}
}
