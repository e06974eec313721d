package converge

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"

	"github.com/pushd/pushd/snapshot"
	"github.com/pushd/pushd/snapshot/store"
)

// maxScopeRows bounds the rows one listing of one scope reads: the oldest
// changes first, so a scope with more changes than that in one interval
// is read over the next rounds, never skipped.
const maxScopeRows = 500

// sqlScopeChanges lists, for each scope (tenant, id of column %[1]s, since
// in Unix ms, 0 for none), its tasks changed since then, oldest first, at
// most $6 each: one row per scope with no change (id NULL), so every scope
// carries PostgreSQL's now. A scope without since (neither marked nor
// known since when it is watched) starts $5 seconds back.
// With the (tenant_id, %[1]s, updated_at) index each scope is one range
// scan of its changes.
const sqlScopeChanges = `SELECT s.i, t.id, t.version, t.status, t.updated_at > now() - make_interval(secs => $4),
	floor(extract(epoch FROM t.updated_at) * 1000)::bigint, floor(extract(epoch FROM now()) * 1000)::bigint
FROM unnest($1::text[], $2::text[], $3::bigint[]) WITH ORDINALITY AS s(tenant, scope, since, i)
LEFT JOIN LATERAL (
	SELECT id, version, status, updated_at FROM generation_tasks
	WHERE tenant_id = s.tenant AND %[1]s = s.scope
		AND updated_at > CASE WHEN s.since > 0 THEN to_timestamp(s.since / 1000.0) ELSE now() - make_interval(secs => $5) END
	ORDER BY updated_at, id LIMIT $6
) t ON true`

var (
	sqlProjectChanges = fmt.Sprintf(sqlScopeChanges, "project_id")
	sqlUserChanges    = fmt.Sprintf(sqlScopeChanges, "user_id")
)

// scopeCheckRequest is one checkScopes of watched scopes.
type scopeCheckRequest struct {
	Scopes []snapshot.Scope // at most store.MaxCheck, valid ids
	// Hold is how long this check's claims keep the fleet's other nodes
	// from listing the same scopes.
	Hold time.Duration
	// LookBack is how far back a listing reaches behind the end of the
	// last one (and a scope's first listing behind now): a change
	// committed late, or found too young to take last time, is listed
	// again. At least a second.
	LookBack time.Duration
	// Publish stores a snapshot in Redis unless a newer one is there and
	// announces it: the node's publisher. It is called from several
	// goroutines at once.
	Publish func(context.Context, *snapshot.Snapshot) error
	// Announce announces a stored snapshot again, whose writer may not have.
	Announce func(context.Context, *snapshot.Snapshot) error
}

// scopeCheckResult is what a checkScopes found.
type scopeCheckResult struct {
	// Repaired are changes PostgreSQL held newer than Redis, which
	// checkScopes published.
	Repaired []*snapshot.Snapshot
	// Announced are changes Redis held in the version PostgreSQL holds,
	// which checkScopes announced: most were announced already, some
	// never were.
	Announced []*snapshot.Snapshot
	// Skipped and Slow are checkResult's.
	Skipped, Slow bool
}

// change is one row of a scope listing.
type change struct {
	id       string
	version  int64
	finished bool
	young    bool
	at       int64 // updated_at, Unix ms, rounded down
}

// checkScopes is a repair round's read of watched project and user
// scopes: for the scopes this node claims for the fleet (one node per
// scope per req.Hold), the tasks PostgreSQL lists as changed since the
// scope's last listing, versions only. A change newer than its task's last
// check is a change nobody may have announced, to subscriptions that never
// held the task too (a task created in a watched project): one PostgreSQL
// newer than Redis is read and published, one Redis holds is announced
// again, and the task's marker records the version, so every node hears
// the ordinary hint once per version. Its PostgreSQL part runs in a slot
// of the node's only while fewer than half of them are busy, as
// checkTasks's.
func (r *Repairer) checkScopes(ctx context.Context, req scopeCheckRequest) (scopeCheckResult, error) {
	var out scopeCheckResult
	if len(req.Scopes) > store.MaxCheck {
		return out, fmt.Errorf("%w: %d scopes, at most %d", snapshot.ErrInvalidID, len(req.Scopes), store.MaxCheck)
	}
	for _, sc := range req.Scopes {
		if !snapshot.ValidID(sc.TenantID) || (sc.ProjectID == "") == (sc.UserID == "") ||
			(sc.ProjectID != "" && !snapshot.ValidID(sc.ProjectID)) || (sc.UserID != "" && !snapshot.ValidID(sc.UserID)) {
			return out, fmt.Errorf("%w: scope %+v", snapshot.ErrInvalidID, sc)
		}
	}
	busy, slots := r.store.PostgresSlots()
	if slots == 0 || len(req.Scopes) == 0 {
		return out, nil
	}
	ctx, cancel := context.WithTimeout(ctx, r.store.FetchTimeout())
	defer cancel()
	if out.Skipped = r.yields(busy, slots); out.Skipped {
		return out, nil
	}
	keys := make([]string, len(req.Scopes))
	for i, sc := range req.Scopes {
		keys[i] = r.scopeKey(sc)
	}
	since, err := r.claimKeys(ctx, keys, req.Hold, true)
	if err != nil {
		return out, err
	}
	began := time.Now()
	err = r.listScopes(ctx, req, keys, since, &out)
	out.Slow = time.Since(began) > slowCheck
	if err != nil {
		r.stats.checkSkipped.Add(1)
		out.Skipped = true
	}
	return out, err
}

func (r *Repairer) scopeKey(sc snapshot.Scope) string {
	if sc.ProjectID != "" {
		return r.names.ScopeChecked(sc.TenantID, "project", sc.ProjectID)
	}
	return r.names.ScopeChecked(sc.TenantID, "user", sc.UserID)
}

// listScopes lists the changes of the claimed scopes (since[i] >= 0), a
// query per kind, takes what is newer than each task's last check, and
// moves each scope's marker on to where its next listing starts.
func (r *Repairer) listScopes(ctx context.Context, req scopeCheckRequest, keys []string, since []int64, out *scopeCheckResult) error {
	lookBack := max(req.LookBack, time.Second)
	var projects, users []int
	for i, sc := range req.Scopes {
		switch {
		case since[i] < 0:
		case sc.ProjectID != "":
			projects = append(projects, i)
		default:
			users = append(users, i)
		}
	}
	changes := make([][]change, len(req.Scopes))
	next := make([]int64, len(req.Scopes)) // where each listed scope's next listing starts, Unix ms
	for _, q := range []struct {
		sql    string
		scopes []int
	}{{sqlProjectChanges, projects}, {sqlUserChanges, users}} {
		if len(q.scopes) == 0 {
			continue
		}
		tenants, ids, from := make([]string, len(q.scopes)), make([]string, len(q.scopes)), make([]int64, len(q.scopes))
		for j, i := range q.scopes {
			sc := req.Scopes[i]
			tenants[j], ids[j], from[j] = sc.TenantID, sc.ProjectID+sc.UserID, since[i]
			if from[j] == 0 && sc.WatchedSince > 0 {
				from[j] = sc.WatchedSince - lookBack.Milliseconds()
			}
		}
		args := []any{tenants, ids, from, checkGrace.Seconds(), lookBack.Seconds(), maxScopeRows}
		err := r.query(ctx, q.sql, args, func(rows pgx.Rows) error {
			defer rows.Close()
			for rows.Next() {
				var ord int
				var id, status *string
				var version, at *int64
				var young *bool
				var now int64
				if err := rows.Scan(&ord, &id, &version, &status, &young, &at, &now); err != nil {
					return err
				}
				i := q.scopes[ord-1]
				next[i] = now - lookBack.Milliseconds()
				if id != nil {
					changes[i] = append(changes[i], change{*id, *version, snapshot.TerminalStatus(*status), *young, *at})
				}
			}
			return rows.Err()
		})
		if err != nil {
			return err
		}
		r.stats.scopesListed.Add(uint64(len(q.scopes)))
	}
	byID := make(map[string]change)
	for i, cs := range changes {
		for _, c := range cs {
			byID[c.id] = c
		}
		if len(cs) == maxScopeRows {
			// Full: the next listing goes on after the last row read, or
			// before the first one too young to take, the newest rows.
			next[i] = cs[len(cs)-1].at
			for _, c := range cs {
				if c.young {
					next[i] = c.at - 1
					break
				}
			}
		}
	}
	r.stats.checkRows.Add(uint64(len(byID)))
	if err := r.takeChanges(ctx, req, byID, out); err != nil {
		return err
	}
	// A listing that is not full starts the next one LookBack before its
	// end (PostgreSQL's now): young rows and late commits are listed again.
	pipe := r.rdb.Pipeline()
	for i := range changes {
		if since[i] >= 0 {
			pipe.HSet(ctx, keys[i], "v", strconv.FormatInt(max(next[i], 1), 10))
		}
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return fmt.Errorf("redis: recording scope listings: %w", err)
	}
	return nil
}

// takeChanges publishes or announces each listed change newer than its
// task's last check and old enough, and records the versions taken in the
// tasks' markers. What failed is listed again while it is within the look
// back, and logged.
func (r *Repairer) takeChanges(ctx context.Context, req scopeCheckRequest, byID map[string]change, out *scopeCheckResult) error {
	if len(byID) == 0 {
		return nil
	}
	ids := make([]string, 0, len(byID))
	for id := range byID {
		ids = append(ids, id)
	}
	pipe := r.rdb.Pipeline()
	marks := make([]*redis.StringCmd, len(ids))
	for i, id := range ids {
		marks[i] = pipe.HGet(ctx, r.names.Checked(id), "v")
	}
	_, _ = pipe.Exec(ctx) // the commands carry their own errors; a missing marker is redis.Nil
	var newer []string
	for i, id := range ids {
		checked, err := marks[i].Int64()
		if err != nil && err != redis.Nil {
			return fmt.Errorf("redis: reading repair markers: %w", err)
		}
		if c := byID[id]; c.version > checked && !c.young {
			newer = append(newer, id)
		}
	}
	stored, err := r.store.ReadRedis(ctx, newer)
	if err != nil {
		return err
	}
	taken := make(map[string]bool, len(newer))
	var absent []string
	for _, id := range newer {
		c, snap := byID[id], stored[id]
		switch {
		case snap == nil || snap.Version < c.version:
			absent = append(absent, id)
		case snap.Version == c.version:
			if err := req.Announce(ctx, snap); err != nil {
				r.log.WarnContext(ctx, "snapshot: announcing a listed change failed", "task_id", id, "err", err)
				continue
			}
			r.stats.announced.Add(1)
			out.Announced = append(out.Announced, snap)
			taken[id] = true
		default:
			// Redis is ahead of what PostgreSQL showed this listing: a
			// newer change is under way, and the next listing has it.
		}
	}
	if len(absent) > 0 {
		rows, err := r.readNewer(ctx, absent)
		if err != nil {
			return err
		}
		r.publishRepairs(ctx, req.Publish, rows, func(row *snapshot.Snapshot) {
			var redisVersion int64
			if snap := stored[row.TaskID]; snap != nil {
				redisVersion = snap.Version
			}
			r.log.InfoContext(ctx, "snapshot: repaired a change never announced", "task_id", row.TaskID, "tenant_id", row.TenantID,
				"database_version", row.Version, "redis_version", redisVersion, "found_by", "scope listing",
				"age", time.Since(time.UnixMilli(row.UpdatedAt)).Round(time.Millisecond))
			out.Repaired = append(out.Repaired, r.store.Remember(row))
			taken[row.TaskID] = true
		})
	}
	pipe = r.rdb.Pipeline()
	for id := range taken {
		c := byID[id]
		pipe.HSet(ctx, r.names.Checked(id), "v", strconv.FormatInt(c.version, 10), "f", boolDigit(c.finished))
		pipe.PExpire(ctx, r.names.Checked(id), checkedTTL)
	}
	if pipe.Len() > 0 {
		if _, err := pipe.Exec(ctx); err != nil {
			return fmt.Errorf("redis: recording checks: %w", err)
		}
	}
	return nil
}
