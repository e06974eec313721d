package store

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"slices"
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
// per redisBackoff pays it, probing for the recovery. On Redis Cluster the
// backoff is per master: a dead master must not send the reads of the
// others' keys to PostgreSQL too.
const redisBackoff = time.Second

var (
	errRedisBackoff = errors.New("redis: skipped after a recent failure")
	errPoolWait     = errors.New("redis: no pooled connection was free before the read's deadline")
)

// redisBreaker returns the backoff a read of key goes by and whether it
// lets the read try Redis now. On Cluster that is the master serving key's
// slot, by address, from the client's slot map: a lookup in memory once the
// map is loaded, and after a failover the slot's new master, whose backoff
// is its own. Elsewhere, and on Cluster before any node gave the client a
// slot map (its loading failed, so the read will too), it is "", the
// client's.
func (s *Store) redisBreaker(ctx context.Context, key string) (master string, usable bool) {
	now := monotime()
	if now < s.redisRetryAt.Load() {
		return "", false
	}
	if s.cluster == nil {
		return "", true
	}
	m, err := s.cluster.MasterForKey(ctx, key)
	if err != nil {
		return "", true
	}
	master = m.Options().Addr
	if retry := s.masterRetryAt.Load(); retry != nil && now < (*retry)[master] {
		return master, false
	}
	return master, true
}

// redisWritable reports whether what PostgreSQL answered for ids may be
// written to Redis: no read of their keys failed meanwhile, which would
// make the write wait on the same failure.
func (s *Store) redisWritable(ctx context.Context, ids []string) bool {
	if s.cluster == nil {
		return monotime() >= s.redisRetryAt.Load()
	}
	for _, id := range ids {
		if _, usable := s.redisBreaker(ctx, s.names.Snapshot(id)); !usable {
			return false
		}
	}
	return true
}

// redisFailed records a read of key from master that failed with err (see
// redisBreaker), and returns the error to report. On Cluster it also has
// the client reload its slot map, which go-redis does on a redirection but
// not when a master stops answering: after a failover, the next read goes
// to the promoted replica. A read whose time ran out while it waited for
// one of the node's pooled connections trips nothing and is reported as
// errPoolWait: its own node was busy, not Redis, and sending every read to
// PostgreSQL for a second would only add a herd there.
func (s *Store) redisFailed(ctx context.Context, key, master string, err error) error {
	if s.waitedForConn(ctx, key, err) {
		s.stats.redisPoolWaits.Add(1)
		return errPoolWait
	}
	s.stats.redisErrors.Add(1)
	now := monotime()
	if master == "" {
		s.redisRetryAt.Store(now + int64(redisBackoff))
		return err
	}
	s.cluster.ReloadState(context.Background()) // in the background, at most one at a time
	// A new map each time, so reads take no lock; it keeps only the
	// backoffs still running, a few masters' at most.
	for {
		old := s.masterRetryAt.Load()
		next := map[string]int64{master: now + int64(redisBackoff)}
		if old != nil {
			for addr, at := range *old {
				if addr != master && at > now {
					next[addr] = at
				}
			}
		}
		if s.masterRetryAt.CompareAndSwap(old, &next) {
			return err
		}
	}
}

// waitedForConn reports whether err ended a read of key while it waited
// for a pooled connection: ErrPoolTimeout after the pool's PoolTimeout, or
// the context's error itself (a dial or a read past the deadline fails
// with a net error instead) while every connection the pool opened is in
// use. go-redis also returns the context's error when the deadline passes
// between retries of a failed attempt; then Redis, refusing or dropping
// connections, leaves the pool none open.
func (s *Store) waitedForConn(ctx context.Context, key string, err error) bool {
	switch {
	case errors.Is(err, redis.ErrPoolTimeout), errors.Is(err, errPoolWait):
		return true
	case err != context.DeadlineExceeded:
		return false
	}
	pool := s.rdb
	if s.cluster != nil {
		m, err := s.cluster.MasterForKey(ctx, key)
		if err != nil {
			return false
		}
		pool = m
	}
	st := pool.PoolStats()
	return st.TotalConns > 0 && st.IdleConns == 0
}

// redisRead logs how a Redis read went: failures as one episode per outage
// (skips during the backoff are not attempts; a caller that gave up says
// nothing about Redis), and the first success after them.
func (s *Store) redisRead(ctx context.Context, err error, args ...any) {
	switch {
	case err == nil:
		s.lost.OK("snapshot: redis reads answer again")
	case errors.Is(err, errRedisBackoff):
	case errors.Is(err, errPoolWait):
		s.log.DebugContext(ctx, "snapshot: redis read waited out its time for a pooled connection", args...)
	case ctx.Err() != nil:
		s.log.DebugContext(ctx, "snapshot: redis read abandoned", append(args, "err", err)...)
	default:
		s.lost.Fail("snapshot: redis read failed, falling back to postgres", err, args...)
	}
}

// readRedis reads a task's snapshot and, when checkMissing is set, its
// negative-cache marker, in one round trip. A document that does not parse
// counts as a miss: PostgreSQL will answer and the write-back replaces it.
//
// ctx is a fetch's (shared), which ends only after the read returns, so
// the read's deadline is made apart from it: as its child, the read would
// also cost a place among its children, a channel and their locks.
func (s *Store) readRedis(ctx context.Context, id string, checkMissing bool) (snap *snapshot.Snapshot, missing bool, err error) {
	deadline := time.Now().Add(s.cfg.FetchTimeout / redisTimeoutShare)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	ctx, cancel := context.WithDeadline(context.WithoutCancel(ctx), deadline)
	defer cancel()
	key := s.names.Snapshot(id) // the marker's shares its slot
	master, usable := s.redisBreaker(ctx, key)
	if !usable {
		s.stats.redisSkipped.Add(1)
		return nil, false, errRedisBackoff
	}
	s.stats.redisReads.Add(1)
	var get *redis.StringCmd
	var exists *redis.IntCmd
	if checkMissing {
		pipe := s.rdb.Pipeline()
		get = pipe.Get(ctx, key)
		exists = pipe.Exists(ctx, s.names.NotFound(id))
		_, _ = pipe.Exec(ctx) // the commands carry their own errors
	} else {
		get = s.rdb.Get(ctx, key)
	}
	b, err := get.Bytes()
	switch {
	case errors.Is(err, redis.Nil):
	case err != nil:
		return nil, false, fmt.Errorf("redis get %s: %w", id, s.redisFailed(ctx, key, master, err))
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
// undecodable ones are missing from the map. With markers it reads their
// negative-cache markers too, and reports the ids absent that have one. On
// Cluster some masters' keys may be skipped or fail while the others' are
// read: the map holds what was read, and the error says why the rest was
// not.
func (s *Store) readRedisMany(ctx context.Context, ids []string, markers bool) (found map[string]*snapshot.Snapshot, missing map[string]bool, err error) {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.FetchTimeout/redisTimeoutShare)
	defer cancel()
	per := 1
	if markers {
		per = 2
	}
	names := make([]string, 0, per*len(ids))
	for _, id := range ids {
		names = append(names, s.names.Snapshot(id))
		if markers {
			names = append(names, s.names.NotFound(id)) // in the snapshot's slot
		}
	}
	vals, err := s.getKeys(ctx, names)
	if vals == nil {
		return nil, nil, err
	}
	found = make(map[string]*snapshot.Snapshot, len(ids))
	for i, id := range ids {
		v := vals[per*i]
		var str string
		switch v := v.(type) {
		case string:
			str = v
		case error: // not read
			continue
		default: // absent
			s.stats.redisMisses.Add(1)
			if markers {
				if _, ok := vals[per*i+1].(string); ok {
					if missing == nil {
						missing = make(map[string]bool)
					}
					missing[id] = true
				}
			}
			continue
		}
		snap, err := snapshot.Parse([]byte(str))
		if err != nil || snap.TaskID != id {
			s.stats.redisMisses.Add(1)
			s.log.DebugContext(ctx, "snapshot: undecodable snapshot in redis", "task_id", id, "err", err)
			continue
		}
		snap.Origin = snapshot.OriginRedis
		s.stats.redisHits.Add(1)
		found[id] = snap
	}
	return found, missing, err
}

// ReadRedis reads the snapshots of ids from Redis alone: no in-process
// cache, no PostgreSQL, MaxMany of them per MGET (on Cluster a pipeline of
// GETs). It exists for the repair checks of package converge, which
// compare what Redis holds with PostgreSQL: a cached copy would hide what
// Redis lost. What it finds is cached all the same, and a newer version
// cached meanwhile is answered instead. Absent tasks are missing from the
// map. A failed MGET ends the read: the map holds the batches before it.
func (s *Store) ReadRedis(ctx context.Context, ids []string) (map[string]*snapshot.Snapshot, error) {
	out := make(map[string]*snapshot.Snapshot, len(ids))
	if s.rdb == nil || len(ids) == 0 {
		return out, nil
	}
	if !s.enter() {
		return out, errClosed
	}
	defer s.inflight.Done()
	for i := 0; i < len(ids); i += snapshot.MaxMany {
		found, _, err := s.readRedisMany(ctx, ids[i:min(i+snapshot.MaxMany, len(ids))], false)
		s.redisRead(ctx, err, "tasks", len(ids))
		if err != nil {
			return out, err
		}
		for id, snap := range found {
			out[id] = s.remember(snap)
		}
	}
	return out, nil
}

// getKeys reads names with one round trip: MGET, or getEach on Cluster.
func (s *Store) getKeys(ctx context.Context, names []string) ([]any, error) {
	if s.names.Cluster {
		return s.getEach(ctx, names)
	}
	return s.mget(ctx, names)
}

// mget is MGET under the client's one backoff.
func (s *Store) mget(ctx context.Context, names []string) ([]any, error) {
	if monotime() < s.redisRetryAt.Load() {
		s.stats.redisSkipped.Add(uint64(len(names)))
		return nil, errRedisBackoff
	}
	s.stats.redisReads.Add(1)
	vals, err := s.rdb.MGet(ctx, names...).Result()
	if err != nil {
		return nil, fmt.Errorf("redis mget: %w", s.redisFailed(ctx, names[0], "", err))
	}
	return vals, nil
}

// getEach is MGET for Redis Cluster, where one MGET across slots fails with
// CROSSSLOT: a pipeline of GETs, which the cluster client splits by master.
// An absent key is a nil value, as in MGET's reply. A key not read, because
// its master is in its backoff or failed now, is the error why (MGET's
// reply has none); the error returned is then the first failure, else the
// backoff's, and the values are nil if no key was read.
func (s *Store) getEach(ctx context.Context, names []string) ([]any, error) {
	vals := make([]any, len(names))
	masters := make([]string, len(names))
	cmds := make([]*redis.StringCmd, len(names))
	pipe := s.rdb.Pipeline()
	var skipped uint64
	for i, name := range names {
		master, usable := s.redisBreaker(ctx, name)
		if !usable {
			vals[i] = errRedisBackoff
			skipped++
			continue
		}
		masters[i] = master
		cmds[i] = pipe.Get(ctx, name)
	}
	var err error
	if skipped > 0 {
		s.stats.redisSkipped.Add(skipped)
		err = errRedisBackoff
	}
	if skipped == uint64(len(names)) {
		return nil, err
	}
	s.stats.redisReads.Add(1)
	_, _ = pipe.Exec(ctx) // the commands carry their own errors
	// The masters whose reads failed, each recorded once, and the error
	// recorded for each.
	var failed []string
	var reported []error
	for i, cmd := range cmds {
		if cmd == nil {
			continue
		}
		v, cmdErr := cmd.Result()
		switch {
		case errors.Is(cmdErr, redis.Nil):
		case cmdErr != nil:
			if at := slices.Index(failed, masters[i]); at >= 0 {
				cmdErr = reported[at]
			} else {
				cmdErr = s.redisFailed(ctx, names[i], masters[i], cmdErr)
				failed, reported = append(failed, masters[i]), append(reported, cmdErr)
			}
			vals[i] = cmdErr
			if err == nil || errors.Is(err, errRedisBackoff) {
				err = fmt.Errorf("redis mget: %w", cmdErr)
			}
		default:
			vals[i] = v
		}
	}
	return vals, err
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
	results := s.runScripts(ctx, rediswrite.SetIfNewer, calls)
	at := monotime() // after the writes, which a Redis read begun before may miss
	for i, res := range results {
		if res.err == nil {
			res.err = s.countRefusal(rediswrite.Outcome(res.n).Err(snaps[i].TaskID))
		}
		switch {
		case errors.Is(res.err, snapshot.ErrTenantMismatch):
			s.log.WarnContext(ctx, "snapshot: write-back refused, redis holds the task as another tenant's", "task_id", snaps[i].TaskID, "tenant_id", snaps[i].TenantID)
		case res.err != nil:
			s.log.DebugContext(ctx, "snapshot: write-back failed", "task_id", snaps[i].TaskID, "err", res.err)
		default: // Redis holds this version or a newer one
			raise(s.writtenBack, snaps[i].TaskID, at)
			if rediswrite.Outcome(res.n) == rediswrite.Written {
				s.stats.writeBacks.Add(1)
			}
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
	results := s.runScripts(ctx, setNotFoundScript, calls)
	at := monotime() // after the writes, as in writeBack
	for i, res := range results {
		if res.err != nil {
			s.log.DebugContext(ctx, "snapshot: setting the negative cache failed", "task_id", ids[i], "err", res.err)
			continue
		}
		raise(s.writtenBack, ids[i], at) // the marker, or a snapshot written meanwhile
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
