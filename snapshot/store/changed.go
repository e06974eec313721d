package store

import (
	"context"
	"fmt"
	"time"

	"github.com/pushd/pushd/snapshot"
)

// MaxCheck bounds the ids of one Rows, one PostgreSQL query: a batch of
// the repair checks of package converge, whose claims and query of
// versions it bounds too.
const MaxCheck = 1000

// Rows reads the rows of ids (at most MaxCheck) from PostgreSQL,
// never from Redis or the cache, in a query sent after the call began (a
// read of the same tasks sent earlier is not shared: it may predate the
// change the caller heard of). It caches and writes back nothing: what
// the caller publishes stores what is newer. A task without a row is left
// out.
func (s *Store) Rows(ctx context.Context, ids []string) ([]*snapshot.Snapshot, error) {
	if len(ids) > MaxCheck {
		return nil, fmt.Errorf("%w: %d ids, at most %d", snapshot.ErrInvalidID, len(ids), MaxCheck)
	}
	for _, id := range ids {
		if !snapshot.ValidID(id) {
			return nil, fmt.Errorf("%w: %q", snapshot.ErrInvalidID, id)
		}
	}
	if s.db == nil || len(ids) == 0 {
		return nil, nil
	}
	if !s.enter() {
		return nil, errClosed
	}
	defer s.inflight.Done()
	res, err := s.readDB(ctx, ids, 0, false, true, 0)
	defer res.release()
	rows := make([]*snapshot.Snapshot, 0, len(res.found))
	for _, row := range res.found {
		rows = append(rows, row)
	}
	return rows, err
}

// Changed is a row ChangedSince listed, with its updated_at to the
// microsecond: with the task's id, where the next listing starts.
type Changed struct {
	Snapshot *snapshot.Snapshot
	At       time.Time
}

// MaxChanged bounds the rows of one ChangedSince.
const MaxChanged = 500

var sqlChangedSince = `SELECT ` + taskColumns + ` FROM generation_tasks
	WHERE (updated_at, id) > ($1, $2) ORDER BY updated_at, id LIMIT $3`

// ChangedSince lists the rows whose (updated_at, id) comes after (at,
// afterID), in that order, at most limit (at most MaxChanged) of them:
// the change reader's catch-up over what was committed while no reader
// listened. It reads through the index of db/migrations/0006_task_changes.sql.
func (s *Store) ChangedSince(ctx context.Context, at time.Time, afterID string, limit int) ([]Changed, error) {
	if limit <= 0 || limit > MaxChanged {
		limit = MaxChanged
	}
	if s.db == nil {
		return nil, nil
	}
	if !s.enter() {
		return nil, errClosed
	}
	defer s.inflight.Done()
	var out []Changed
	statement := func() (string, []any) { return sqlChangedSince, []any{at, afterID, limit} }
	err := s.query(ctx, true, statement, func(row *snapshot.Snapshot, at time.Time) {
		out = append(out, Changed{Snapshot: row, At: at})
	})
	return out, err
}
