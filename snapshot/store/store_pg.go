package store

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/pushd/pushd/snapshot"
)

// taskColumns are the columns a snapshot is built of. The last, the
// extra column of db/migrations/0005_task_extra.sql, is read through the
// row's JSON so that it is NULL, not an error, where that migration has
// not run yet: a node upgraded before its database keeps serving.
const taskColumns = `id, tenant_id, project_id, user_id, status, progress, stage, provider, model,
	queue_position, preview_asset_id, output_asset_id, error_code, version, updated_at,
	to_jsonb(generation_tasks) -> 'extra'`

var (
	sqlTaskByID       = `SELECT ` + taskColumns + ` FROM generation_tasks WHERE id = $1`
	sqlTasksByIDs     = `SELECT ` + taskColumns + ` FROM generation_tasks WHERE id = ANY($1)`
	sqlTasksByProject = `SELECT ` + taskColumns + ` FROM generation_tasks
	WHERE tenant_id = $1 AND project_id = $2 ORDER BY updated_at DESC, id LIMIT ` + strconv.Itoa(snapshot.MaxList)
	sqlTasksByUser = `SELECT ` + taskColumns + ` FROM generation_tasks
	WHERE tenant_id = $1 AND user_id = $2 ORDER BY updated_at DESC, id LIMIT ` + strconv.Itoa(snapshot.MaxList)
)

// query runs one statement of the queries above and calls each for every
// row (with its updated_at to the microsecond), holding one of MaxDBQueries slots. A slot is waited for at most
// DBQueueWait (and while ctx lasts); then the query is rejected with
// ErrUnavailable, so a storm queues briefly instead of piling up. A
// caller's query (one for a caller that can give up) takes a slot of
// callerSem first. prepare gives the statement and its arguments once the
// slot is taken, before anything is sent: a read of tasks by id then asks
// for the ids other reads added while it waited (readDB).
func (s *Store) query(ctx context.Context, caller bool, prepare func() (sql string, args []any), each func(*snapshot.Snapshot, time.Time)) error {
	if caller {
		if err := s.slot(ctx, s.callerSem); err != nil {
			return err
		}
		defer func() { <-s.callerSem }()
	}
	if err := s.slot(ctx, s.sem); err != nil {
		return err
	}
	defer func() { <-s.sem }()
	sql, args := prepare()
	s.stats.dbQueries.Add(1)
	scan := func(rows pgx.Rows) error {
		return scanTasks(rows, each, func(id string, err error) {
			s.log.WarnContext(ctx, "snapshot: a task row pushd cannot represent", "task_id", id, "err", err)
		})
	}
	if err := s.queryTx(ctx, sql, args, scan); err != nil {
		s.stats.dbErrors.Add(1)
		return fmt.Errorf("postgres: %w", err)
	}
	return nil
}

// slot takes a token of sem, waiting at most DBQueueWait.
func (s *Store) slot(ctx context.Context, sem chan struct{}) error {
	select {
	case sem <- struct{}{}:
		return nil
	default:
	}
	wait := time.NewTimer(s.cfg.DBQueueWait)
	defer wait.Stop()
	select {
	case sem <- struct{}{}:
		return nil
	case <-wait.C:
		s.stats.dbRejected.Add(1)
		return fmt.Errorf("%w: %d postgres queries in flight for %v", snapshot.ErrUnavailable, cap(sem), s.cfg.DBQueueWait)
	case <-ctx.Done():
		s.stats.dbRejected.Add(1)
		return fmt.Errorf("%w: %d postgres queries in flight: %w", snapshot.ErrUnavailable, cap(sem), ctx.Err())
	}
}

// PostgresSlots is how many of the store's PostgreSQL slots
// (Config.MaxDBQueries) are taken now, and how many there are; 0 and 0
// without PostgreSQL. Work that can wait for a later round (the repair
// checks of package converge) reads it to leave PostgreSQL to the reads of
// subscribers and notifications.
func (s *Store) PostgresSlots() (busy, slots int) {
	if s.db == nil {
		return 0, 0
	}
	return len(s.sem), cap(s.sem)
}

var errBusy = fmt.Errorf("%w: postgres slots busy", snapshot.ErrUnavailable)

// TryQuery runs one statement in one of the store's PostgreSQL slots if
// one is free now, without waiting for one, in a read-only transaction
// under the statement timeout, and hands its rows to scan. It is for work
// that can wait (the repair checks of package converge, whose statements
// are their own): it fails with snapshot.ErrUnavailable, sending nothing,
// when no slot is free or the Store is closed; any other error is the
// statement's. Its queries are not in Stats's DBQueries, the reads of
// subscribers and notifications.
func (s *Store) TryQuery(ctx context.Context, sql string, args []any, scan func(pgx.Rows) error) error {
	if s.db == nil {
		return fmt.Errorf("%w: no postgres", snapshot.ErrUnavailable)
	}
	if !s.enter() {
		return errClosed
	}
	defer s.inflight.Done()
	select {
	case s.sem <- struct{}{}:
	default:
		return errBusy
	}
	defer func() { <-s.sem }()
	if err := s.queryTx(ctx, sql, args, scan); err != nil {
		return fmt.Errorf("postgres: %w", err)
	}
	return nil
}

// queryTx runs sql in a read-only transaction whose statement_timeout is
// StatementTimeout, in two round trips: BEGIN and SET LOCAL travel in one
// simple-protocol message; the query and COMMIT in one pipeline. Every
// statement runs under the timeout, including pgx preparing sql on a fresh
// connection, which takes table locks too. A context deadline alone would
// not do: it drops the connection but leaves the query running on the
// server.
func (s *Store) queryTx(ctx context.Context, sql string, args []any, scan func(pgx.Rows) error) (err error) {
	conn, err := s.db.Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	defer func() {
		// After a failed statement the transaction is aborted. Roll back so
		// the connection returns to the pool; if that fails too, the pool
		// discards a connection left inside a transaction.
		if err != nil && conn.Conn().PgConn().TxStatus() != 'I' && !conn.Conn().IsClosed() {
			_, _ = conn.Exec(ctx, "ROLLBACK")
		}
	}()
	if _, err := conn.Exec(ctx, s.beginSQL); err != nil {
		return err
	}
	var b pgx.Batch
	b.Queue(sql, args...)
	b.Queue("COMMIT")
	br := conn.SendBatch(ctx, &b)
	rows, err := br.Query()
	if err == nil {
		err = scan(rows)
	}
	if err == nil {
		_, err = br.Exec()
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	return err
}

// taskRow is a generation_tasks row in the order and spelling of the
// snapshot JSON of docs/DESIGN.md, "Snapshot document"; nil pointers
// encode as null.
type taskRow struct {
	TaskID         string  `json:"task_id"`
	TenantID       string  `json:"tenant_id"`
	ProjectID      string  `json:"project_id"`
	UserID         string  `json:"user_id"`
	Status         string  `json:"status"`
	Progress       int32   `json:"progress"`
	Stage          *string `json:"stage"`
	Provider       *string `json:"provider"`
	Model          *string `json:"model"`
	QueuePosition  *int32  `json:"queue_position"`
	PreviewAssetID *string `json:"preview_asset_id"`
	OutputAssetID  *string `json:"output_asset_id"`
	ErrorCode      *string `json:"error_code"`
	Version        int64   `json:"version"`
	UpdatedAt      int64   `json:"updated_at"` // Unix milliseconds
}

// scanTasks turns rows into snapshots: the columns, then the members of
// the row's extra object, and gives each with its updated_at to the
// microsecond (the snapshot holds it to the millisecond). A row pushd
// cannot represent (an id outside ValidID, a version below 1) is a bug
// upstream; it goes to bad and is skipped, so it cannot break a whole
// list. An extra the snapshot cannot carry (written before the column's
// check, or past the document's limits) goes to bad too, and the snapshot
// is built of the columns alone.
func scanTasks(rows pgx.Rows, each func(*snapshot.Snapshot, time.Time), bad func(id string, err error)) error {
	defer rows.Close()
	for rows.Next() {
		var r taskRow
		var updated time.Time
		var extra []byte
		if err := rows.Scan(&r.TaskID, &r.TenantID, &r.ProjectID, &r.UserID, &r.Status, &r.Progress,
			&r.Stage, &r.Provider, &r.Model, &r.QueuePosition, &r.PreviewAssetID, &r.OutputAssetID,
			&r.ErrorCode, &r.Version, &updated, &extra); err != nil {
			return err
		}
		r.UpdatedAt = updated.UnixMilli()
		b, err := json.Marshal(&r)
		if err != nil {
			return err
		}
		snap, err := parseRow(b, extra)
		if err != nil && extra != nil {
			bad(r.TaskID, fmt.Errorf("extra left out: %w", err))
			snap, err = parseRow(b, nil)
		}
		if err != nil {
			bad(r.TaskID, fmt.Errorf("row skipped: %w", err))
			continue
		}
		snap.Origin = snapshot.OriginPostgres
		each(snap, updated)
	}
	return rows.Err()
}

// parseRow parses the document of a row's columns (a JSON object) with
// the members of extra, a JSON object or nil, appended.
func parseRow(columns, extra []byte) (*snapshot.Snapshot, error) {
	extra = bytes.TrimSpace(extra)
	if len(extra) == 0 || bytes.Equal(extra, []byte("{}")) {
		return snapshot.Parse(columns)
	}
	if extra[0] != '{' {
		return nil, errors.New("extra is not a JSON object")
	}
	var doc bytes.Buffer
	doc.Grow(len(columns) + len(extra))
	doc.Write(columns[:len(columns)-1])
	join := doc.Len()
	if err := json.Compact(&doc, extra); err != nil {
		return nil, err
	}
	doc.Bytes()[join] = ',' // the extra's opening brace
	return snapshot.Parse(doc.Bytes())
}
