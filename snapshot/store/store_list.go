package store

import (
	"context"
	"fmt"
	"time"

	"github.com/pushd/pushd/snapshot"
)

// ListProject returns the snapshots of a project's MaxList most recently
// updated tasks, newest first, from PostgreSQL (cached ListCacheTTL). A task
// this node has since seen in a newer version is returned in that version.
func (s *Store) ListProject(ctx context.Context, tenantID, projectID string) ([]*snapshot.Snapshot, error) {
	if !snapshot.ValidID(tenantID) || !snapshot.ValidID(projectID) {
		return nil, snapshot.ErrInvalidID
	}
	return s.list(ctx, projectListKey(tenantID, projectID), sqlTasksByProject, tenantID, projectID)
}

// ListUser returns the snapshots of a user's MaxList most recently updated
// tasks, like ListProject.
func (s *Store) ListUser(ctx context.Context, tenantID, userID string) ([]*snapshot.Snapshot, error) {
	if !snapshot.ValidID(tenantID) || !snapshot.ValidID(userID) {
		return nil, snapshot.ErrInvalidID
	}
	return s.list(ctx, userListKey(tenantID, userID), sqlTasksByUser, tenantID, userID)
}

// The keys of the list cache cannot collide between kinds because ids never
// hold a NUL byte.
func projectListKey(tenantID, projectID string) string {
	return "project\x00" + tenantID + "\x00" + projectID
}

func userListKey(tenantID, userID string) string { return "user\x00" + tenantID + "\x00" + userID }

// ListCached reports whether ListProject (projectID set) or ListUser would
// be answered from the in-process cache.
func (s *Store) ListCached(tenantID, projectID, userID string) bool {
	key := userListKey(tenantID, userID)
	if projectID != "" {
		key = projectListKey(tenantID, projectID)
	}
	_, ok := s.lists.get(key)
	return ok
}

// list serves a list query.
func (s *Store) list(ctx context.Context, key, sql string, args ...any) ([]*snapshot.Snapshot, error) {
	if s.db == nil {
		return nil, fmt.Errorf("list: %w: no database", snapshot.ErrUnavailable)
	}
	rows, ok := s.lists.get(key)
	if ok {
		s.stats.cacheHits.Add(1)
	} else {
		s.stats.cacheMisses.Add(1)
		var err error
		rows, err = shared(ctx, s, &s.listFlights, key, func(ctx context.Context) ([]*snapshot.Snapshot, error) {
			// As in fetch: a late flight finds the previous one's result.
			if rows, ok := s.lists.get(key); ok {
				return rows, nil
			}
			var rows []*snapshot.Snapshot
			statement := func() (string, []any) { return sql, args }
			if err := s.query(ctx, true, statement, func(row *snapshot.Snapshot, _ time.Time) { rows = append(rows, row) }); err != nil {
				return nil, fmt.Errorf("list: %w: %w", snapshot.ErrUnavailable, err)
			}
			s.stats.dbHits.Add(uint64(len(rows)))
			for _, row := range rows {
				s.remember(row)
			}
			s.lists.put(key, rows)
			if s.lists.ttl > 0 {
				s.stats.cacheSets.Add(1)
			}
			return rows, nil
		})
		if err != nil {
			return nil, err
		}
	}
	// The cached slice is shared: fold newer versions into a copy.
	out := make([]*snapshot.Snapshot, len(rows))
	for i, row := range rows {
		if cur, ok := s.tasks.get(row.TaskID); ok && cur.Version > row.Version {
			row = cur
		}
		out[i] = row
	}
	return out, nil
}
