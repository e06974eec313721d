package store

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pushd/pushd/internal/redisx"
	"github.com/pushd/pushd/snapshot"
	"github.com/pushd/pushd/snapshot/rediswrite"
)

//go:embed setnotfound.lua
var setNotFoundLua string

var setNotFoundScript = redis.NewScript(setNotFoundLua)

// redisTimeoutShare is the part of FetchTimeout a Redis read may take, so an
// unresponsive Redis leaves time for the PostgreSQL fallback.
const redisTimeoutShare = 4

// redisBackoff is how long reads skip Redis after a read failed. A Redis
// that is down costs every read its client's dial retries (half a second
// with go-redis defaults) before the PostgreSQL fallback; this way one read
// per redisBackoff pays it, probing for the recovery.
const redisBackoff = time.Second

var errRedisBackoff = errors.New("redis: skipped after a recent failure")

// redisUsable reports whether reads should try Redis now.
func (s *Store) redisUsable() bool { return monotime() >= s.redisRetryAt.Load() }

// redisFailed records a failed Redis read.
func (s *Store) redisFailed() {
	s.stats.redisErrors.Add(1)
	s.redisRetryAt.Store(monotime() + int64(redisBackoff))
}

// redisRead logs how a Redis read went: failures as one episode per outage
// (skips during the backoff are not attempts; a caller that gave up says
// nothing about Redis), and the first success after them.
func (s *Store) redisRead(ctx context.Context, err error, args ...any) {
	switch {
	case err == nil:
		s.lost.OK("snapshot: redis reads answer again")
	case errors.Is(err, errRedisBackoff):
	case ctx.Err() != nil:
		s.log.DebugContext(ctx, "snapshot: redis read abandoned", append(args, "err", err)...)
	default:
		s.lost.Fail("snapshot: redis read failed, falling back to postgres", err, args...)
	}
}

// readRedis reads a task's snapshot and, when checkMissing is set, its
// negative-cache marker, in one round trip. A document that does not parse
// counts as a miss: PostgreSQL will answer and the write-back replaces it.
func (s *Store) readRedis(ctx context.Context, id string, checkMissing bool) (snap *snapshot.Snapshot, missing bool, err error) {
	if !s.redisUsable() {
		s.stats.redisSkipped.Add(1)
		return nil, false, errRedisBackoff
	}
	ctx, cancel := context.WithTimeout(ctx, s.cfg.FetchTimeout/redisTimeoutShare)
	defer cancel()
	s.stats.redisReads.Add(1)
	var get *redis.StringCmd
	var exists *redis.IntCmd
	if checkMissing {
		pipe := s.rdb.Pipeline()
		get = pipe.Get(ctx, s.names.Snapshot(id))
		exists = pipe.Exists(ctx, s.names.NotFound(id))
		_, _ = pipe.Exec(ctx) // the commands carry their own errors
	} else {
		get = s.rdb.Get(ctx, s.names.Snapshot(id))
	}
	b, err := get.Bytes()
	switch {
	case errors.Is(err, redis.Nil):
	case err != nil:
		s.redisFailed()
		return nil, false, fmt.Errorf("redis get %s: %w", id, err)
	default:
		snap, err := snapshot.Parse(b)
		if err == nil && snap.TaskID == id {
			snap.Origin = snapshot.OriginRedis
			s.stats.redisHits.Add(1)
			return snap, false, nil
		}
		s.log.DebugContext(ctx, "snapshot: undecodable snapshot in redis", "task_id", id, "err", err)
	}
	s.stats.redisMisses.Add(1)
	// An error reading the marker only costs a PostgreSQL query.
	return nil, exists != nil && exists.Val() > 0, nil
}

// readRedisMany reads the snapshots of ids with one MGET; absent and
// undecodable ones are missing from the map.
func (s *Store) readRedisMany(ctx context.Context, ids []string) (map[string]*snapshot.Snapshot, error) {
	if !s.redisUsable() {
		s.stats.redisSkipped.Add(uint64(len(ids)))
		return nil, errRedisBackoff
	}
	ctx, cancel := context.WithTimeout(ctx, s.cfg.FetchTimeout/redisTimeoutShare)
	defer cancel()
	names := make([]string, len(ids))
	for i, id := range ids {
		names[i] = s.names.Snapshot(id)
	}
	s.stats.redisReads.Add(1)
	var vals []any
	var err error
	if s.names.Cluster {
		vals, err = s.getEach(ctx, names)
	} else {
		vals, err = s.rdb.MGet(ctx, names...).Result()
	}
	if err != nil {
		s.redisFailed()
		return nil, fmt.Errorf("redis mget: %w", err)
	}
	found := make(map[string]*snapshot.Snapshot, len(ids))
	for i, v := range vals {
		str, ok := v.(string)
		if !ok {
			s.stats.redisMisses.Add(1)
			continue
		}
		snap, err := snapshot.Parse([]byte(str))
		if err != nil || snap.TaskID != ids[i] {
			s.stats.redisMisses.Add(1)
			s.log.DebugContext(ctx, "snapshot: undecodable snapshot in redis", "task_id", ids[i], "err", err)
			continue
		}
		snap.Origin = snapshot.OriginRedis
		s.stats.redisHits.Add(1)
		found[ids[i]] = snap
	}
	return found, nil
}

// getEach is MGET for Redis Cluster, where one MGET across slots fails with
// CROSSSLOT: a pipeline of GETs, which the cluster client splits by master.
// An absent key is a nil value, as in MGET's reply.
func (s *Store) getEach(ctx context.Context, names []string) ([]any, error) {
	pipe := s.rdb.Pipeline()
	cmds := make([]*redis.StringCmd, len(names))
	for i, name := range names {
		cmds[i] = pipe.Get(ctx, name)
	}
	_, _ = pipe.Exec(ctx) // the commands carry their own errors
	vals := make([]any, len(names))
	for i, cmd := range cmds {
		v, err := cmd.Result()
		switch {
		case errors.Is(err, redis.Nil):
		case err != nil:
			return nil, err
		default:
			vals[i] = v
		}
	}
	return vals, nil
}

// writeBack stores snapshots read from PostgreSQL in Redis with the TTL their
// status calls for, unless Redis holds a newer version. Failures are logged
// at debug and otherwise ignored: the snapshot was served, and Redis may be
// down. A write refused because Redis holds the task as another tenant's
// is logged as a warning: something wrote it there by hand.
func (s *Store) writeBack(ctx context.Context, snaps []*snapshot.Snapshot) {
	calls := make([]scriptCall, len(snaps))
	for i, snap := range snaps {
		calls[i].keys, calls[i].args = rediswrite.WriteCall(s.names, snap, snapshot.TTLWithJitter(snap.Status))
	}
	for i, res := range s.runScripts(ctx, rediswrite.SetIfNewer, calls) {
		if res.err == nil {
			res.err = s.countRefusal(rediswrite.Outcome(res.n).Err(snaps[i].TaskID))
		}
		switch {
		case errors.Is(res.err, snapshot.ErrTenantMismatch):
			s.log.WarnContext(ctx, "snapshot: write-back refused, redis holds the task as another tenant's", "task_id", snaps[i].TaskID, "tenant_id", snaps[i].TenantID)
		case res.err != nil:
			s.log.DebugContext(ctx, "snapshot: write-back failed", "task_id", snaps[i].TaskID, "err", res.err)
		case rediswrite.Outcome(res.n) == rediswrite.Written:
			s.stats.writeBacks.Add(1)
		}
	}
}

// setMissing caches "not found" for ids in process and, when inRedis is
// set, in Redis for every node, unless a snapshot appeared meanwhile.
func (s *Store) setMissing(ctx context.Context, ids []string, inRedis bool) {
	if s.cfg.NegativeTTL <= 0 || len(ids) == 0 {
		return
	}
	for _, id := range ids {
		s.markMissing(id)
	}
	if s.rdb == nil || !inRedis {
		return
	}
	ttl := strconv.FormatInt(max(s.cfg.NegativeTTL.Milliseconds(), 1), 10)
	calls := make([]scriptCall, len(ids))
	for i, id := range ids {
		calls[i] = scriptCall{keys: []string{s.names.Snapshot(id), s.names.NotFound(id)}, args: []any{ttl}}
	}
	for i, res := range s.runScripts(ctx, setNotFoundScript, calls) {
		if res.err != nil {
			s.log.DebugContext(ctx, "snapshot: setting the negative cache failed", "task_id", ids[i], "err", res.err)
		}
	}
}

type scriptCall struct {
	keys []string
	args []any
}

type scriptResult struct {
	n   int64
	err error
}

// runScripts runs script once per call: one call with Run (EVALSHA, then
// EVAL if Redis lacks the script), several in one pipeline of EVALSHA,
// retrying with Run those that met a Redis without the script.
func (s *Store) runScripts(ctx context.Context, script *redis.Script, calls []scriptCall) []scriptResult {
	out := make([]scriptResult, len(calls))
	if len(calls) == 1 {
		out[0].n, out[0].err = script.Run(ctx, s.rdb, calls[0].keys, calls[0].args...).Int64()
		return out
	}
	pipe := s.rdb.Pipeline()
	cmds := make([]*redis.Cmd, len(calls))
	for i, c := range calls {
		cmds[i] = script.EvalSha(ctx, pipe, c.keys, c.args...)
	}
	_, _ = pipe.Exec(ctx) // the commands carry their own errors
	for i, cmd := range cmds {
		out[i].n, out[i].err = cmd.Int64()
		if redisx.IsNoScript(out[i].err) {
			out[i].n, out[i].err = script.Run(ctx, s.rdb, calls[i].keys, calls[i].args...).Int64()
		}
	}
	return out
}
