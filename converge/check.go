package converge

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"

	"github.com/pushd/pushd/internal/redisx"
	"github.com/pushd/pushd/snapshot"
	"github.com/pushd/pushd/snapshot/store"
)

//go:embed check.lua
var checkLua string

var checkScript = redis.NewScript(checkLua)

// checkedTTL is how long a task's repair marker outlives its last claim:
// longer than any snapshot's TTL, so a version checked once is known as
// checked after Redis expired its snapshot, for as long as the task is
// watched (every claim renews it).
const checkedTTL = time.Hour

// checkGrace is how old a version found newer in PostgreSQL than in Redis
// must be, by PostgreSQL's clock (updated_at against now()), before a check
// takes it for a change never announced: a Task State Service stores the
// snapshot and announces it a few milliseconds after it commits the row,
// and a check between the two must not publish in its stead. A younger
// one is looked at again by the next round.
const checkGrace = 500 * time.Millisecond

var sqlVersionsByIDs = `SELECT id, version, status, updated_at > now() - make_interval(secs => $2) FROM generation_tasks WHERE id = ANY($1)`

// checkRequest is one checkTasks of watched tasks.
type checkRequest struct {
	IDs []string // at most store.MaxCheck, valid ids
	// Hold is how long this check's claims keep the fleet's other nodes
	// from checking the same tasks against PostgreSQL.
	Hold time.Duration
	// Finished includes the tasks whose last check found them finished
	// (SUCCEEDED, FAILED, CANCELED), which are otherwise left out of the
	// PostgreSQL part.
	Finished bool
	// Publish stores a snapshot in Redis unless a newer one is there and
	// announces it: the node's publisher. Required with PostgreSQL. It is
	// called from several goroutines at once.
	Publish func(context.Context, *snapshot.Snapshot) error
}

// checkResult is what a checkTasks found.
type checkResult struct {
	// Found is the newest snapshot of each task found: Redis's, or the
	// PostgreSQL row where that is newer.
	Found map[string]*snapshot.Snapshot
	// Repaired are the rows of Found that PostgreSQL held newer than Redis
	// and than the task's last check, a change never announced, which
	// checkTasks published.
	Repaired []*snapshot.Snapshot
	// Skipped says the PostgreSQL part was not run: half of the node's
	// PostgreSQL slots or more were busy, or it failed.
	Skipped bool
	// Slow says its PostgreSQL part (the versions, and the rows it read
	// and published) took longer than slowCheck: the caller should wait
	// longer before the next.
	Slow bool
}

// slowCheck is how long a check's PostgreSQL part may take before the
// check reports PostgreSQL slow: half the statement timeout's default.
const slowCheck = time.Second

// checkTasks is a repair round's read of watched tasks: every task's
// snapshot from Redis (store.ReadRedis: no in-process cache, no PostgreSQL
// fallback), and, for the tasks this node claims for the fleet (one node
// per task per req.Hold), the version PostgreSQL holds. A task whose
// PostgreSQL version is newer than Redis's and than the version its last
// check found is a change nobody announced: its row is read and published
// (stored if newer, and announced), so every node watching it hears the
// ordinary hint, and the task's marker records the version. The
// PostgreSQL part takes one of the node's PostgreSQL slots only while
// fewer than half of them are busy: subscribers' reads come first.
func (r *Repairer) checkTasks(ctx context.Context, req checkRequest) (checkResult, error) {
	out := checkResult{Found: make(map[string]*snapshot.Snapshot, len(req.IDs))}
	if len(req.IDs) > store.MaxCheck {
		return out, fmt.Errorf("%w: %d ids, at most %d", snapshot.ErrInvalidID, len(req.IDs), store.MaxCheck)
	}
	for _, id := range req.IDs {
		if !snapshot.ValidID(id) {
			return out, fmt.Errorf("%w: %q", snapshot.ErrInvalidID, id)
		}
	}
	if len(req.IDs) == 0 {
		return out, nil
	}
	ctx, cancel := context.WithTimeout(ctx, r.store.FetchTimeout())
	defer cancel()
	found, err := r.store.ReadRedis(ctx, req.IDs)
	out.Found = found
	if err != nil {
		return out, err
	}
	busy, slots := r.store.PostgresSlots()
	if slots == 0 { // no PostgreSQL: Redis's part only
		return out, nil
	}
	if out.Skipped = r.yields(busy, slots); out.Skipped {
		return out, nil
	}
	claimed, err := r.claim(ctx, req.IDs, req.Hold, req.Finished)
	if err != nil || len(claimed) == 0 {
		return out, err
	}
	err = r.checkClaimed(ctx, req, claimed, &out)
	if err != nil {
		r.stats.checkSkipped.Add(1)
		out.Skipped = true
	}
	return out, err
}

// checkClaimed reads the versions of the claimed tasks from PostgreSQL,
// publishes what is newer there, and records each version checked in the
// task's marker.
func (r *Repairer) checkClaimed(ctx context.Context, req checkRequest, claimed map[string]int64, out *checkResult) error {
	ids := make([]string, 0, len(claimed))
	for id := range claimed {
		ids = append(ids, id)
	}
	type version struct {
		v               int64
		finished, young bool
	}
	versions := make(map[string]version, len(ids))
	began := time.Now()
	defer func() { out.Slow = out.Slow || time.Since(began) > slowCheck }()
	err := r.query(ctx, sqlVersionsByIDs, []any{ids, checkGrace.Seconds()}, func(rows pgx.Rows) error {
		defer rows.Close()
		for rows.Next() {
			var id, status string
			var v int64
			var young bool
			if err := rows.Scan(&id, &v, &status, &young); err != nil {
				return err
			}
			versions[id] = version{v, snapshot.TerminalStatus(status), young}
		}
		return rows.Err()
	})
	r.stats.checked.Add(uint64(len(ids)))
	r.stats.checkRows.Add(uint64(len(versions)))
	if err != nil {
		return err
	}
	var newer []string
	for id, pg := range versions {
		var stored int64
		if snap := out.Found[id]; snap != nil {
			stored = snap.Version
		}
		// A task never checked whose snapshot Redis lacks (expired, or
		// Redis is cold: a reconnect storm's reads are writing it back) is
		// only recorded: nothing says anyone holds an older version.
		if pg.v > stored && pg.v > claimed[id] && (stored > 0 || claimed[id] > 0) {
			newer = append(newer, id)
		}
	}
	// What is not published is not recorded: the next check finds it
	// again. A young version may be on its way to Redis still.
	unpublished := make(map[string]bool, len(newer))
	for _, id := range newer {
		unpublished[id] = true
	}
	newer = slices.DeleteFunc(newer, func(id string) bool { return versions[id].young })
	if len(newer) > 0 {
		rows, err := r.readNewer(ctx, newer)
		if err != nil {
			return err
		}
		r.publishRepairs(ctx, req.Publish, rows, func(row *snapshot.Snapshot) {
			var redisVersion int64
			if stored := out.Found[row.TaskID]; stored != nil {
				redisVersion = stored.Version
			}
			delete(unpublished, row.TaskID)
			r.log.InfoContext(ctx, "snapshot: repaired a change never announced", "task_id", row.TaskID, "tenant_id", row.TenantID,
				"database_version", row.Version, "redis_version", redisVersion, "checked_version", claimed[row.TaskID],
				"age", time.Since(time.UnixMilli(row.UpdatedAt)).Round(time.Millisecond))
			out.Found[row.TaskID] = r.store.Remember(row)
			out.Repaired = append(out.Repaired, row)
		})
	}
	pipe := r.rdb.Pipeline()
	for id, pg := range versions {
		if pg.v > claimed[id] && !unpublished[id] {
			pipe.HSet(ctx, r.names.Checked(id), "v", strconv.FormatInt(pg.v, 10), "f", boolDigit(pg.finished))
		}
	}
	if pipe.Len() > 0 {
		if _, err := pipe.Exec(ctx); err != nil {
			return fmt.Errorf("redis: recording checks: %w", err)
		}
	}
	return nil
}

// repairPublishers bounds the publishes of one check in flight: a round
// that found many changes never announced (a writer whose Redis writes
// failed for a while) publishes them in a few round trips' time, not one
// after another until its deadline.
const repairPublishers = 16

// publishRepairs publishes rows, changes never announced, a few at a
// time, and calls published with each one that was, one call at a time.
func (r *Repairer) publishRepairs(ctx context.Context, publish func(context.Context, *snapshot.Snapshot) error, rows []*snapshot.Snapshot, published func(*snapshot.Snapshot)) {
	var (
		mu        sync.Mutex
		wg        sync.WaitGroup
		failed    int    // guarded by mu, as published's calls
		firstTask string // of the failed ones
		firstErr  error
	)
	sem := make(chan struct{}, repairPublishers)
	for _, row := range rows {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			err := publish(ctx, row)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				if failed++; failed == 1 {
					firstTask, firstErr = row.TaskID, err
				}
				return
			}
			r.stats.repaired.Add(1)
			published(row)
		})
	}
	wg.Wait()
	if failed > 0 {
		// Once a check: when Redis is slow, every publish of a round fails
		// alike, and the next round finds them again.
		r.log.WarnContext(ctx, "snapshot: publishing changes never announced failed", "tasks", failed, "of", len(rows),
			"first_task_id", firstTask, "err", firstErr)
	}
}

// readNewer reads the rows of ids from PostgreSQL (store.Rows: a query
// sent after the call began), and caches nothing: the publish that follows
// stores what is newer.
func (r *Repairer) readNewer(ctx context.Context, ids []string) ([]*snapshot.Snapshot, error) {
	rows, err := r.store.Rows(ctx, ids)
	r.stats.checkRows.Add(uint64(len(rows))) // its query is in the store's DBQueries
	return rows, err
}

// claim runs the claim script over the tasks' markers. It returns the
// claimed tasks with the version of their last check.
func (r *Repairer) claim(ctx context.Context, ids []string, hold time.Duration, finished bool) (map[string]int64, error) {
	keys := make([]string, len(ids))
	for i, id := range ids {
		keys[i] = r.names.Checked(id)
	}
	vals, err := r.claimKeys(ctx, keys, hold, finished)
	if err != nil {
		return nil, err
	}
	claimed := make(map[string]int64)
	for i, v := range vals {
		if v >= 0 {
			claimed[ids[i]] = v
		}
	}
	return claimed, nil
}

// claimKeys runs the claim script over markers (check.lua): one script for
// all of them on standalone Redis, so two nodes' claims of one batch never
// interleave; one per marker on Redis Cluster, where each is in its own
// slot. It returns, per marker, its v when claimed and -1 when not.
func (r *Repairer) claimKeys(ctx context.Context, keys []string, hold time.Duration, finished bool) ([]int64, error) {
	args := []any{max(hold.Milliseconds(), 1), boolDigit(finished), checkedTTL.Milliseconds()}
	if !r.names.Cluster {
		vals, err := checkScript.Run(ctx, r.rdb, keys, args...).Int64Slice()
		if err != nil {
			return nil, fmt.Errorf("redis: claiming checks: %w", err)
		}
		return vals, nil
	}
	pipe := r.rdb.Pipeline()
	cmds := make([]*redis.Cmd, len(keys))
	for i, k := range keys {
		cmds[i] = checkScript.EvalSha(ctx, pipe, []string{k}, args...)
	}
	_, _ = pipe.Exec(ctx) // the commands carry their own errors
	vals := make([]int64, len(keys))
	for i, cmd := range cmds {
		v, err := cmd.Int64Slice()
		if redisx.IsNoScript(err) {
			v, err = checkScript.Run(ctx, r.rdb, []string{keys[i]}, args...).Int64Slice()
		}
		if err != nil {
			return nil, fmt.Errorf("redis: claiming checks: %w", err)
		}
		vals[i] = v[0]
	}
	return vals, nil
}

// yields reports, counting it, whether a check leaves PostgreSQL to
// subscribers' reads: half of the node's slots or more are busy
// (store.PostgresSlots).
func (r *Repairer) yields(busy, slots int) bool {
	if busy >= max(slots/2, 1) {
		r.stats.checkSkipped.Add(1)
		return true
	}
	return false
}

// query runs one statement of a check in a PostgreSQL slot if one is free
// now, without waiting for one (store.TryQuery), counting it among the
// checks' queries, not in the store's DBQueries, which are the reads of
// subscribers and notifications.
func (r *Repairer) query(ctx context.Context, sql string, args []any, scan func(pgx.Rows) error) error {
	err := r.store.TryQuery(ctx, sql, args, scan)
	if errors.Is(err, snapshot.ErrUnavailable) {
		return err // not sent: no slot was free
	}
	r.stats.checkQueries.Add(1)
	if err != nil {
		r.stats.checkErrors.Add(1)
	}
	return err
}

func boolDigit(b bool) string {
	if b {
		return "1"
	}
	return "0"
}
