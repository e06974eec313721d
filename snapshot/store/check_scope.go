package store

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"

	"github.com/pushd/pushd/snapshot"
)

// MaxScopeRows bounds the rows one listing of one scope reads: the oldest
// changes first, so a scope with more changes than that in one interval
// is read over the next rounds, never skipped.
const MaxScopeRows = 500

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

// ScopeCheckRequest is one CheckScopes of watched scopes.
type ScopeCheckRequest struct {
	Scopes []snapshot.Scope // at most MaxCheck, valid ids
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

// ScopesChecked is what a CheckScopes found.
type ScopesChecked struct {
	// Repaired are changes PostgreSQL held newer than Redis, which
	// CheckScopes published.
	Repaired []*snapshot.Snapshot
	// Announced are changes Redis held in the version PostgreSQL holds,
	// which CheckScopes announced: most were announced already, some
	// never were.
	Announced []*snapshot.Snapshot
	// Skipped and Slow are Checked's.
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

// CheckScopes is a repair round's read of watched project and user scopes:
// for the scopes this node claims for the fleet (one node per scope per
// req.Hold), the tasks PostgreSQL lists as changed since the scope's last
// listing, versions only. A change newer than its task's last check is a
// change nobody may have announced, to subscriptions that never held the
// task too (a task created in a watched project): one PostgreSQL newer
// than Redis is read and published, one Redis holds is announced again,
// and the task's marker records the version, so every node hears the
// ordinary hint once per version. Its PostgreSQL part runs in a slot of the
// node's only while fewer than half of them are busy, as Check's.
func (s *Store) CheckScopes(ctx context.Context, req ScopeCheckRequest) (ScopesChecked, error) {
	var out ScopesChecked
	if len(req.Scopes) > MaxCheck {
		return out, fmt.Errorf("%w: %d scopes, at most %d", snapshot.ErrInvalidID, len(req.Scopes), MaxCheck)
	}
	for _, sc := range req.Scopes {
		if !snapshot.ValidID(sc.TenantID) || (sc.ProjectID == "") == (sc.UserID == "") ||
			(sc.ProjectID != "" && !snapshot.ValidID(sc.ProjectID)) || (sc.UserID != "" && !snapshot.ValidID(sc.UserID)) {
			return out, fmt.Errorf("%w: scope %+v", snapshot.ErrInvalidID, sc)
		}
	}
	if s.rdb == nil || s.db == nil || len(req.Scopes) == 0 {
		return out, nil
	}
	if !s.enter() {
		return out, errClosed
	}
	defer s.inflight.Done()
	ctx, cancel := context.WithTimeout(ctx, s.cfg.FetchTimeout)
	defer cancel()
	if out.Skipped = s.checkYields(); out.Skipped {
		return out, nil
	}
	keys := make([]string, len(req.Scopes))
	for i, sc := range req.Scopes {
		keys[i] = s.scopeKey(sc)
	}
	since, err := s.claimKeys(ctx, keys, req.Hold, true)
	if err != nil {
		return out, err
	}
	began := time.Now()
	err = s.listScopes(ctx, req, keys, since, &out)
	out.Slow = time.Since(began) > slowCheck
	if err != nil {
		s.stats.checkSkipped.Add(1)
		out.Skipped = true
	}
	return out, err
}

func (s *Store) scopeKey(sc snapshot.Scope) string {
	if sc.ProjectID != "" {
		return s.names.ScopeChecked(sc.TenantID, "project", sc.ProjectID)
	}
	return s.names.ScopeChecked(sc.TenantID, "user", sc.UserID)
}

// listScopes lists the changes of the claimed scopes (since[i] >= 0), a
// query per kind, takes what is newer than each task's last check, and
// moves each scope's marker on to where its next listing starts.
func (s *Store) listScopes(ctx context.Context, req ScopeCheckRequest, keys []string, since []int64, out *ScopesChecked) error {
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
		args := []any{tenants, ids, from, checkGrace.Seconds(), lookBack.Seconds(), MaxScopeRows}
		err := s.tryQuery(ctx, q.sql, args, func(rows pgx.Rows) error {
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
		s.stats.scopesListed.Add(uint64(len(q.scopes)))
	}
	byID := make(map[string]change)
	for i, cs := range changes {
		for _, c := range cs {
			byID[c.id] = c
		}
		if len(cs) == MaxScopeRows {
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
	s.stats.checkRows.Add(uint64(len(byID)))
	if err := s.takeChanges(ctx, req, byID, out); err != nil {
		return err
	}
	// A listing that is not full starts the next one LookBack before its
	// end (PostgreSQL's now): young rows and late commits are listed again.
	pipe := s.rdb.Pipeline()
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
func (s *Store) takeChanges(ctx context.Context, req ScopeCheckRequest, byID map[string]change, out *ScopesChecked) error {
	if len(byID) == 0 {
		return nil
	}
	ids := make([]string, 0, len(byID))
	for id := range byID {
		ids = append(ids, id)
	}
	pipe := s.rdb.Pipeline()
	marks := make([]*redis.StringCmd, len(ids))
	for i, id := range ids {
		marks[i] = pipe.HGet(ctx, s.names.Checked(id), "v")
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
	stored := make(map[string]*snapshot.Snapshot, len(newer))
	for i := 0; i < len(newer); i += snapshot.MaxMany {
		found, _, err := s.readRedisMany(ctx, newer[i:min(i+snapshot.MaxMany, len(newer))], false)
		s.redisRead(ctx, err, "tasks", len(newer))
		if err != nil {
			return err
		}
		for id, snap := range found {
			stored[id] = s.remember(snap)
		}
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
				s.log.WarnContext(ctx, "snapshot: announcing a listed change failed", "task_id", id, "err", err)
				continue
			}
			s.stats.announced.Add(1)
			out.Announced = append(out.Announced, snap)
			taken[id] = true
		default:
			// Redis is ahead of what PostgreSQL showed this listing: a
			// newer change is under way, and the next listing has it.
		}
	}
	if len(absent) > 0 {
		rows, err := s.readNewer(ctx, absent)
		if err != nil {
			return err
		}
		s.publishRepairs(ctx, req.Publish, rows, func(row *snapshot.Snapshot) {
			var redisVersion int64
			if snap := stored[row.TaskID]; snap != nil {
				redisVersion = snap.Version
			}
			s.log.InfoContext(ctx, "snapshot: repaired a change never announced", "task_id", row.TaskID, "tenant_id", row.TenantID,
				"database_version", row.Version, "redis_version", redisVersion, "found_by", "scope listing",
				"age", time.Since(time.UnixMilli(row.UpdatedAt)).Round(time.Millisecond))
			out.Repaired = append(out.Repaired, s.remember(row))
			taken[row.TaskID] = true
		})
	}
	pipe = s.rdb.Pipeline()
	for id := range taken {
		c := byID[id]
		pipe.HSet(ctx, s.names.Checked(id), "v", strconv.FormatInt(c.version, 10), "f", boolDigit(c.finished))
		pipe.PExpire(ctx, s.names.Checked(id), checkedTTL)
	}
	if pipe.Len() > 0 {
		if _, err := pipe.Exec(ctx); err != nil {
			return fmt.Errorf("redis: recording checks: %w", err)
		}
	}
	return nil
}
