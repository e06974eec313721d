package store

import (
	"context"
	"errors"
	"math"
	"time"

	"github.com/pushd/pushd/snapshot"
)

// dbRead is one PostgreSQL query of tasks by id, shared by every read of
// those tasks that needs PostgreSQL while it is registered: a Get's flight
// and a GetMany batch alike, whichever sent it.
type dbRead struct {
	// sent is the monotime its query took a PostgreSQL slot, after which
	// it is sent; 0 while it waits for one. Guarded by Store.dbMu.
	sent int64
	// caller says the query waits in the callers' share of the slots
	// (query): a delivery's read does not join it before it is sent.
	caller bool
	// ids are the tasks the query asks for: its owner's first, then those
	// of other callers' reads that joined it while it waited for a slot
	// (Store.absorbing). Guarded by Store.dbMu until sent.
	ids  []string
	done chan struct{} // closed once rows and err are set
	rows map[string]*snapshot.Snapshot
	err  error
}

// dbResult is what readDB read.
type dbResult struct {
	found map[string]*snapshot.Snapshot // every id of the call found, by its query, a shared read or the cache
	// rows and absent are what this call's own query found, for the ids
	// other reads added to it too: the caller caches and writes them back
	// (keep) before it calls release.
	rows   []*snapshot.Snapshot
	absent []string
	mine   *dbRead
	own    int      // of mine's ids, how many are this call's
	ids    []string // mine's ids, once sent
	s      *Store

	// again are the ids another read wrote back to Redis after the
	// caller's Redis read began: neither queried nor waited for, they are
	// for the caller to read from Redis again.
	again []string
}

// release unregisters the caller's query, once what it read is in the
// in-process cache and, when Redis took it, in Redis: until then a read of
// those tasks shares it instead of sending one more. Idempotent.
func (r *dbResult) release() {
	if r.mine == nil {
		return
	}
	r.s.dbMu.Lock()
	for _, id := range r.mine.ids {
		if r.s.dbReads[id] == r.mine {
			delete(r.s.dbReads, id)
		}
	}
	r.s.dbMu.Unlock()
	r.mine = nil
}

// readDB reads ids from PostgreSQL with at most one query per task at a
// time across the Store: an id another caller is reading is waited for,
// and the rest go in one query of this call, registered before it waits
// for a PostgreSQL slot. With cached set and atLeast <= 0 any registered
// read is shared, as singleflight shares a flight, and an id the cache
// holds meanwhile is answered from it; otherwise (Reload, or a version
// announced) only reads not sent before this call are: one still waiting
// for a slot, or sent since, cannot miss a change made before it. A
// delivery's read (caller unset: the hub's, for a notification) shares a
// caller's read only once it is sent. The caller must call release once it
// has cached what it read, even when err is set; err reports a failed
// query, this call's or a shared one, and the rows read before it are in
// the result still.
//
// With cached set and atLeast <= 0, an id another read had Redis hold
// (writtenBack) at or after redisAt, the monotime the caller's Redis read
// of ids began (0: none), is neither read nor waited for but set aside in
// the result's again: the caller reads it from Redis again, and asks
// PostgreSQL (redisAt 0) only for what Redis lacks.
func (s *Store) readDB(ctx context.Context, ids []string, atLeast int64, cached, caller bool, redisAt int64) (*dbResult, error) {
	notBefore := int64(math.MinInt64)
	if !cached || atLeast > 0 {
		notBefore = monotime()
		redisAt = 0 // Redis's copy may be a read's sent before this call
	}
	res := &dbResult{s: s, found: make(map[string]*snapshot.Snapshot, len(ids))}
	joined := make(map[string]*dbRead)
	s.dbMu.Lock()
	for _, id := range ids {
		// A delivery's read (not a caller's) joins a caller's read only
		// once it is sent: until then it may wait behind a herd of them.
		if r := s.dbReads[id]; r != nil && (r.sent == 0 && (caller || !r.caller) || r.sent != 0 && r.sent >= notBefore) {
			joined[id] = r
			continue
		}
		// The owner of a read that just finished caches its rows before
		// it unregisters them.
		if cached {
			if snap, ok := s.tasks.get(id); ok && snap.Version >= atLeast {
				s.stats.cacheHits.Add(1)
				res.found[id] = snap
				continue
			}
			if _, ok := s.missing.get(id); ok && atLeast <= 0 {
				s.stats.negativeHits.Add(1)
				continue
			}
			// The owner wrote them back to Redis first (keep): the
			// caller's Redis read may have missed that by a moment, and
			// the cache entry expired while the caller, starved of CPU,
			// came here.
			if at, ok := s.writtenBack.get(id); ok && redisAt != 0 && at >= redisAt {
				res.again = append(res.again, id)
				continue
			}
		}
		// A caller's read joins the query of another caller's read still
		// waiting for a slot: a herd of new connections' reads of as many
		// tasks go in a few queries, not one each. Its owner caches and
		// writes back what it reads.
		if r := s.absorbing; caller && res.mine == nil && r != nil && len(r.ids) < snapshot.MaxMany {
			r.ids = append(r.ids, id)
			s.dbReads[id] = r
			joined[id] = r
			continue
		}
		if res.mine == nil {
			res.mine = &dbRead{caller: caller, done: make(chan struct{})}
			if s.dbReads == nil {
				s.dbReads = make(map[string]*dbRead)
			}
			if caller {
				s.absorbing = res.mine
			}
		}
		s.dbReads[id] = res.mine
		res.mine.ids = append(res.mine.ids, id)
		res.own++
	}
	s.dbMu.Unlock()
	if s.registered != nil {
		s.registered()
	}

	var errs error
	if res.mine != nil {
		errs = s.runDBRead(ctx, res)
	}
	failed := make(map[*dbRead]bool)
	for id, r := range joined {
		select {
		case <-r.done:
		case <-ctx.Done():
			return res, errors.Join(errs, ctx.Err())
		}
		s.stats.sharedCalls.Add(1)
		switch {
		case r.err == nil:
			if row := r.rows[id]; row != nil {
				res.found[id] = row
			}
		case !failed[r]: // its error once, however many ids it held
			failed[r] = true
			errs = errors.Join(errs, r.err)
		}
	}
	return res, errs
}

// runDBRead sends the query res registered for its own ids and those other
// reads added to it, caches nothing on failure, and sorts what it found
// from what PostgreSQL does not hold.
func (s *Store) runDBRead(ctx context.Context, res *dbResult) error {
	r := res.mine
	// Others may be waiting on this query: a caller that leaves (a
	// batch read whose client hung up) must not fail their reads.
	qctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.cfg.FetchTimeout)
	prepare := func() (string, []any) {
		s.dbMu.Lock()
		r.sent = monotime()
		s.closeAbsorbingLocked(r)
		res.ids = r.ids
		s.dbMu.Unlock()
		r.rows = make(map[string]*snapshot.Snapshot, len(res.ids))
		if len(res.ids) == 1 {
			return sqlTaskByID, []any{res.ids[0]}
		}
		return sqlTasksByIDs, []any{res.ids}
	}
	r.err = s.query(qctx, r.caller, prepare, func(row *snapshot.Snapshot, _ time.Time) {
		r.rows[row.TaskID] = row
		res.rows = append(res.rows, row)
	})
	cancel()
	s.dbMu.Lock()
	s.closeAbsorbingLocked(r) // a query refused a slot takes no more
	s.dbMu.Unlock()
	close(r.done)
	if r.err != nil {
		// Nothing to cache: the next reader queries again.
		res.release()
		res.rows = nil
		return r.err
	}
	for i, id := range res.ids {
		row := r.rows[id]
		if row == nil {
			res.absent = append(res.absent, id)
		} else if i < res.own {
			res.found[id] = row
		}
	}
	s.stats.dbHits.Add(uint64(len(res.rows)))
	s.stats.dbMisses.Add(uint64(len(res.absent)))
	return nil
}

// closeAbsorbingLocked stops r taking in other reads' ids. s.dbMu is held.
func (s *Store) closeAbsorbingLocked(r *dbRead) {
	if s.absorbing == r {
		s.absorbing = nil
	}
}
