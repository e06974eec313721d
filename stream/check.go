package stream

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pushd/pushd/internal/redisx"
	"github.com/pushd/pushd/stream/cursor"
)

// state is what one look at a stream found.
type state struct {
	exists     bool
	epoch      cursor.ID
	known      bool      // the epoch key exists
	last       cursor.ID // last-generated-id
	maxDeleted cursor.ID // max-deleted-entry-id: the newest entry XDEL removed
	first      cursor.ID // the first entry's id, when length > 0
	length     int64     // entries now
	added      int64     // entries ever appended to this incarnation
}

// lost reports whether entries after id may have been removed: deleted, or
// trimmed (trimming takes the oldest entries and leaves no mark but the
// first entry's id). It errs on the safe side: when id itself was trimmed,
// it cannot tell whether the entry right after it went too, and says so.
func (st state) lost(id cursor.ID) bool {
	switch {
	case id.Less(st.maxDeleted):
		return true
	case st.length > 0:
		return id.Less(st.first)
	default:
		return id.Less(st.last)
	}
}

// look reads a stream's state in one round trip.
func (t *Tailer) look(ctx context.Context, tl *tail) (state, error) {
	pipe := t.cfg.Client.Pipeline()
	ep := pipe.Get(ctx, tl.epochKey)
	info := pipe.XInfoStream(ctx, tl.key)
	pipe.Exec(ctx) // each command's error is checked below
	return readState(ep, info)
}

func readState(ep *redis.StringCmd, info *redis.XInfoStreamCmd) (state, error) {
	var st state
	if err := info.Err(); err != nil {
		if !redisx.IsNoSuchKey(err) {
			return st, fmt.Errorf("xinfo stream: %w", err)
		}
		return st, nil // no stream: nothing after any start
	}
	switch e, err := ep.Result(); {
	case errors.Is(err, redis.Nil):
	case err != nil:
		return st, fmt.Errorf("get stream epoch: %w", err)
	default:
		if st.epoch, err = cursor.ParseID(e); err == nil {
			st.known = true
		}
	}
	v := info.Val()
	var err error
	if st.last, err = cursor.ParseID(v.LastGeneratedID); err != nil {
		return st, fmt.Errorf("xinfo stream: last-generated-id %q: %w", v.LastGeneratedID, err)
	}
	if v.MaxDeletedEntryID != "" {
		if st.maxDeleted, err = cursor.ParseID(v.MaxDeletedEntryID); err != nil {
			return st, fmt.Errorf("xinfo stream: max-deleted-entry-id %q: %w", v.MaxDeletedEntryID, err)
		}
	}
	if v.Length > 0 {
		if st.first, err = cursor.ParseID(v.FirstEntry.ID); err != nil {
			return st, fmt.Errorf("xinfo stream: first entry %q: %w", v.FirstEntry.ID, err)
		}
	}
	st.exists, st.length, st.added = true, v.Length, v.EntriesAdded
	return st, nil
}

// placeLocked starts tl after what st saw. t.mu is held.
func (t *Tailer) placeLocked(tl *tail, st state) {
	tl.placed, tl.verified, tl.resync = true, true, ""
	tl.gen++
	tl.last, tl.length = st.last, st.length
	tl.epoch, tl.known = st.epoch, st.known
	// A stream with no epoch yet (none, or made by a writer that keeps
	// none) gets one at its next write if the key is missing: that write
	// is the first entry this tail reads.
	tl.learn = !st.known
	tl.pos = ""
	if tl.known {
		tl.pos = cursor.Encode(cursor.Position{Tag: cursor.TenantTag(tl.tenant), Epoch: tl.epoch, ID: tl.last})
	}
}

// gap says why tl cannot continue on the stream st shows, "" if it can.
func gap(tl *tail, st state) string {
	switch {
	case !st.exists:
		if tl.last.IsZero() {
			return "" // still nothing to read
		}
		return ResyncBackwards
	case tl.known && (!st.known || st.epoch != tl.epoch):
		return ResyncEpoch
	case st.last.Less(tl.last):
		return ResyncBackwards
	case tl.last.IsZero():
		// Placed before the stream existed: every entry is one to read,
		// and none may have gone.
		if st.added > st.length || !st.maxDeleted.IsZero() {
			return ResyncTrimmed
		}
	case st.lost(tl.last):
		return ResyncTrimmed
	}
	return ""
}

// prepare checks the tails when in doubt or when a check is due, and places
// anew (re-reading their tenants) those that cannot continue. It reports
// whether everything it tried succeeded.
func (r *reader) prepare(tails []*tail) bool {
	t := r.t
	if len(tails) == 0 {
		return true
	}
	dials := t.dials.Load()
	due := r.doubt || dials != r.dials || !time.Now().Before(r.nextCheck)
	var todo []*tail
	t.mu.RLock()
	for _, tl := range tails {
		if due || !tl.placed {
			todo = append(todo, tl)
		}
	}
	t.mu.RUnlock()
	if len(todo) == 0 {
		return true
	}
	ctx, cancel := context.WithTimeout(t.ctx, placeTimeout)
	defer cancel()
	pipe := t.cfg.Client.Pipeline()
	eps := make([]*redis.StringCmd, len(todo))
	infos := make([]*redis.XInfoStreamCmd, len(todo))
	for i, tl := range todo {
		eps[i] = pipe.Get(ctx, tl.epochKey)
		infos[i] = pipe.XInfoStream(ctx, tl.key)
	}
	pipe.Exec(ctx)
	ok := true
	for i, tl := range todo {
		st, err := readState(eps[i], infos[i])
		if err != nil {
			ok = false
			t.reloadTopology()
			continue
		}
		t.mu.Lock()
		reason := tl.resync
		if tl.placed {
			reason = gap(tl, st)
		}
		if reason == "" {
			tl.verified, tl.length = true, st.length
			t.mu.Unlock()
			continue
		}
		// Whatever this tail promised no longer holds: no Position until
		// the tenant was re-read.
		tl.placed, tl.verified, tl.pos, tl.resync = false, false, "", reason
		tl.gen++
		t.mu.Unlock()
		t.stats.resync(reason)
		t.log.Info("stream cannot continue; re-reading the tenant", "tenant", tl.tenant, "reason", reason)
		if !t.target.ResyncNow(tl.tenant) {
			ok = false
			continue // placed again, and re-read again, on the next round
		}
		// st was seen before the re-read started: the tail resumes there.
		t.mu.Lock()
		t.placeLocked(tl, st)
		t.mu.Unlock()
	}
	if ok && due {
		r.lost.OK("stream reads answer again")
		r.doubt, r.dials = false, dials
		r.nextCheck = time.Now().Add(r.t.cfg.CheckInterval)
	}
	return ok
}
