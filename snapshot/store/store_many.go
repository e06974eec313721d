package store

import (
	"context"
	"errors"
	"fmt"

	"github.com/pushd/pushd/snapshot"
)

// GetMany returns the snapshots of the tasks that exist, keyed by id. It
// serves what the in-process cache holds, reads the rest with one Redis MGET
// and what Redis lacks with one PostgreSQL query, and writes those back. It
// accepts at most MaxMany ids; more fail with ErrInvalidID, like a bad id,
// before any I/O.
func (s *Store) GetMany(ctx context.Context, taskIDs []string) (map[string]*snapshot.Snapshot, error) {
	return s.getMany(ctx, taskIDs, true)
}

// Reload is GetMany without the in-process caches: resync and polling use
// it, because a copy cached while notifications were being lost may be
// stale. What it reads still refreshes the caches.
func (s *Store) Reload(ctx context.Context, taskIDs []string) (map[string]*snapshot.Snapshot, error) {
	return s.getMany(ctx, taskIDs, false)
}

func (s *Store) getMany(ctx context.Context, taskIDs []string, cached bool) (map[string]*snapshot.Snapshot, error) {
	if err := snapshot.CheckMany(taskIDs); err != nil {
		return nil, err
	}
	out, rest := s.manyFromCache(taskIDs, cached)
	if len(rest) == 0 {
		return out, nil
	}
	if !s.enter() {
		return nil, errClosed
	}
	defer s.inflight.Done()
	// The hub delivering what notifications announced does not wait
	// behind callers' queries (query).
	caller := canGiveUp(ctx)
	ctx, cancel := context.WithTimeout(ctx, s.cfg.FetchTimeout)
	defer cancel()

	var redisErr error
	var redisAt int64 // when the Redis read that missed rest began; 0 for none
	if s.rdb != nil {
		at := monotime()
		rest, redisErr = s.manyFromRedis(ctx, rest, false, out)
		if len(rest) == 0 || (redisErr == nil && s.db == nil) {
			return out, nil
		}
		if redisErr == nil {
			redisAt = at
			if s.missedRedis != nil {
				s.missedRedis()
			}
		}
	}
	if s.db == nil {
		return nil, fmt.Errorf("get many: %w", unavailable(rest[0], redisErr))
	}
	again, err := s.manyFromDB(ctx, rest, cached, caller, redisErr, redisAt, out)
	if err == nil && len(again) > 0 {
		// Another read wrote these back to Redis after ours began: read
		// them there. Only what Redis has lost since is asked of
		// PostgreSQL.
		if again, redisErr = s.manyFromRedis(ctx, again, s.cfg.NegativeTTL > 0, out); len(again) > 0 {
			_, err = s.manyFromDB(ctx, again, cached, caller, redisErr, 0, out)
		}
	}
	if err != nil {
		return nil, err
	}
	return out, nil
}

// manyFromCache returns what the in-process caches answer of taskIDs, and
// the rest, each id once. Without cached every id is in the rest.
func (s *Store) manyFromCache(taskIDs []string, cached bool) (out map[string]*snapshot.Snapshot, rest []string) {
	out = make(map[string]*snapshot.Snapshot, len(taskIDs))
	seen := make(map[string]bool, len(taskIDs))
	for _, id := range taskIDs {
		if seen[id] {
			continue
		}
		seen[id] = true
		if !cached {
			rest = append(rest, id)
			continue
		}
		if snap, ok := s.tasks.get(id); ok {
			s.stats.cacheHits.Add(1)
			out[id] = snap
			continue
		}
		if _, ok := s.missing.get(id); ok {
			s.stats.negativeHits.Add(1)
			continue
		}
		s.stats.cacheMisses.Add(1)
		rest = append(rest, id)
	}
	return out, rest
}

// manyFromRedis reads ids with one MGET into out and returns those Redis
// lacks or did not answer for, and why it did not: on Cluster, the keys of
// masters that failed or are in their backoff, the others' being read.
// With markers it reads the negative-cache markers too: a task with one is
// absent, not lacking.
func (s *Store) manyFromRedis(ctx context.Context, ids []string, markers bool, out map[string]*snapshot.Snapshot) ([]string, error) {
	found, missing, err := s.readRedisMany(ctx, ids, markers)
	s.redisRead(ctx, err, "tasks", len(ids))
	missed := ids[:0]
	for _, id := range ids {
		switch {
		case found[id] != nil:
			out[id] = s.remember(found[id])
		case missing[id]:
			s.stats.negativeHits.Add(1)
			s.stats.redisNegative.Add(1)
			s.markMissing(id)
		default:
			missed = append(missed, id)
		}
	}
	return missed, err
}

// manyFromDB reads ids from PostgreSQL into out, writing the rows back to
// Redis unless redisErr says it just failed, and caching what is absent.
// It returns the ids to read from Redis again instead (readDB's again,
// after redisAt).
func (s *Store) manyFromDB(ctx context.Context, ids []string, cached, caller bool, redisErr error, redisAt int64, out map[string]*snapshot.Snapshot) (again []string, err error) {
	// Tasks a Get's flight or another batch is reading from PostgreSQL
	// are waited for, not queried again.
	res, err := s.readDB(ctx, ids, 0, cached, caller, redisAt)
	defer res.release() // once cached and written back
	toRedis := s.rdb != nil && redisErr == nil && s.redisWritable(ctx, res.ids)
	kept := s.keep(ctx, res, toRedis)
	if err != nil {
		// What was read is cached; the batch is not answered.
		return nil, fmt.Errorf("get many: %w: %w", snapshot.ErrUnavailable, errors.Join(redisErr, err))
	}
	for id, snap := range res.found {
		if k := kept[id]; k != nil {
			out[id] = k
		} else { // another read's, or the cache's
			out[id] = s.cachedIfNewer(snap)
		}
	}
	return res.again, nil
}

// cachedIfNewer returns the cached copy of snap's task if it is newer, else
// snap. For a snapshot another read caches: remembering it again here
// would cut short the time a stand-in copy is kept.
func (s *Store) cachedIfNewer(snap *snapshot.Snapshot) *snapshot.Snapshot {
	if cur, ok := s.tasks.get(snap.TaskID); ok && cur.NewerThan(snap.Version) {
		return cur
	}
	return snap
}
