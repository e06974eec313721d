package stream

import (
	"context"
	"errors"
	"math/rand/v2"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pushd/pushd/internal/episode"
	"github.com/pushd/pushd/snapshot"
	"github.com/pushd/pushd/stream/cursor"
)

// reader is one XREAD connection's loop and the tails hashed to it.
type reader struct {
	t      *Tailer
	wake   chan struct{}   // cap 1: a tail was added
	lost   *episode.Logger // failed reads, until a check clears the doubt they cast
	lastOK atomic.Int64    // Unix ns when Redis last answered this reader (or it had nothing to read)
	polled atomic.Int64    // on a cluster, the tails its last round polled: past their master's blocking bound
	// Owned by run.
	doubt     bool   // a read failed, or ran on a new connection: check every tail before trusting it again
	dials     uint64 // Tailer.dials when the last check began
	nextCheck time.Time
}

func (r *reader) signal() {
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

func (r *reader) healthy() bool {
	return time.Since(time.Unix(0, r.lastOK.Load())) < 2*r.t.cfg.Block+time.Second
}

// mine returns the tails of this reader that Watch has finished placing
// (or failed to).
func (r *reader) mine() []*tail {
	t := r.t
	t.mu.RLock()
	defer t.mu.RUnlock()
	var out []*tail
	for _, tl := range t.tenants {
		if tl.rd != r {
			continue
		}
		select {
		case <-tl.ready:
			out = append(out, tl)
		default: // Watch is placing it
		}
	}
	return out
}

// run is the reader's loop: place what needs placing, check what is in
// doubt, XREAD the rest, deliver.
func (r *reader) run() {
	t := r.t
	defer t.wg.Done()
	if t.sharded {
		r.runSharded()
		return
	}
	var backoff time.Duration
	r.nextCheck = time.Now().Add(t.cfg.CheckInterval)
	for t.ctx.Err() == nil {
		tails := r.mine()
		ok := r.prepare(tails)
		var streams []string
		var ids []string
		byKey := make(map[string]*tail)
		t.mu.RLock()
		for _, tl := range tails {
			if tl.verified {
				streams = append(streams, tl.key)
				ids = append(ids, tl.last.String())
				byKey[tl.key] = tl
			}
		}
		t.mu.RUnlock()
		if len(streams) == 0 {
			r.lastOK.Store(time.Now().UnixNano()) // nothing to read is not a failure
			if !r.idle(ok) {
				return
			}
			continue
		}
		res, err := r.read(streams, ids)
		if t.ctx.Err() != nil {
			return
		}
		if err != nil && !errors.Is(err, redis.Nil) {
			t.stats.readErrors.Add(1)
			r.lost.Fail("stream read failed; checking the streams once Redis answers", err)
			r.distrust(tails)
			t.reloadTopology()
			backoff = min(max(2*backoff, minBackoff), maxBackoff)
			if !r.sleep(backoff/2 + rand.N(backoff/2)) {
				return
			}
			continue
		}
		backoff = 0
		t.stats.reads.Add(1)
		if t.dials.Load() != r.dials {
			// The read may have run on a Redis that restarted empty since
			// the last check: check first; the entries are read again.
			r.distrust(tails)
			continue
		}
		r.lastOK.Store(time.Now().UnixNano())
		failed := false
		for _, s := range res {
			if tl := byKey[s.Stream]; tl != nil && !r.deliver(tl, s.Messages) {
				failed = true
			}
		}
		if failed && !r.sleep(minBackoff) { // the batch is read again: give the sources a moment
			return
		}
	}
}

// read returns the entries after ids of streams (redis.Nil for none): one
// XREAD BLOCK on a standalone Redis.
func (r *reader) read(streams, ids []string) ([]redis.XStream, error) {
	t := r.t
	ctx, cancel := context.WithTimeout(t.ctx, t.cfg.Block+time.Second)
	defer cancel()
	return t.xrd.XRead(ctx, &redis.XReadArgs{Streams: append(streams, ids...), Count: t.cfg.Count, Block: t.cfg.Block}).Result()
}

// idle waits for a tail to be added, or for a retry of what failed.
func (r *reader) idle(ok bool) bool {
	if !ok {
		return r.wait(maxBackoff)
	}
	return r.wait(r.t.cfg.CheckInterval)
}

// wait waits d, or less when a tail is added; false when the tailer closed.
func (r *reader) wait(d time.Duration) bool {
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-r.wake:
	case <-timer.C:
	case <-r.t.ctx.Done():
		return false
	}
	return true
}

func (r *reader) sleep(d time.Duration) bool {
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-timer.C:
		return true
	case <-r.t.ctx.Done():
		return false
	}
}

// distrust takes the tails out of Covers until a check clears them.
func (r *reader) distrust(tails []*tail) {
	if !r.doubt {
		r.t.stats.rechecks.Add(1)
	}
	r.doubt = true
	r.t.mu.Lock()
	for _, tl := range tails {
		tl.verified = false
	}
	r.t.mu.Unlock()
}

// deliver hands a stream's new entries to the Target and, once it took
// them, moves the tail past them. It reports whether the Target took them.
func (r *reader) deliver(tl *tail, msgs []redis.XMessage) bool {
	t := r.t
	if len(msgs) == 0 {
		return true
	}
	changes := make([]snapshot.Notification, 0, len(msgs))
	for _, m := range msgs {
		if n, ok := parseEntry(tl.tenant, m); ok {
			changes = append(changes, n)
		} else {
			t.stats.malformed.Add(1)
		}
	}
	first, err1 := cursor.ParseID(msgs[0].ID)
	last, err2 := cursor.ParseID(msgs[len(msgs)-1].ID)
	if err1 != nil || err2 != nil {
		t.stats.malformed.Add(int64(len(msgs)))
		return true // not Redis's ids; nothing sensible to resume from
	}
	if err := t.target.Apply(t.ctx, tl.tenant, changes); err != nil {
		t.stats.applyErrors.Add(1)
		t.log.Debug("delivering stream entries failed; retrying", "tenant", tl.tenant, "entries", len(msgs), "err", err)
		return false
	}
	now := time.Now()
	for _, m := range msgs {
		if id, err := cursor.ParseID(m.ID); err == nil {
			t.stats.lag.Observe(now.Sub(time.UnixMilli(int64(id.MS))))
		}
	}
	t.stats.entries.Add(int64(len(msgs)))

	learn := false
	t.mu.RLock()
	learn = tl.learn
	t.mu.RUnlock()
	var epoch cursor.ID
	known := false
	if learn {
		// The first entry read since placement on a stream without an
		// epoch: it is the epoch if the write that made it set the key.
		ctx, cancel := context.WithTimeout(t.ctx, placeTimeout)
		if e, err := t.cfg.Client.Get(ctx, tl.epochKey).Result(); err == nil {
			if id, err := cursor.ParseID(e); err == nil && id == first {
				epoch, known = id, true
			}
		}
		cancel()
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if !tl.verified {
		return true // distrusted or replaced meanwhile: its next check decides
	}
	tl.last = last
	if learn {
		tl.learn = false
		tl.epoch, tl.known = epoch, known
	}
	if tl.known {
		tl.pos = cursor.Encode(cursor.Position{Tag: cursor.TenantTag(tl.tenant), Epoch: tl.epoch, ID: tl.last})
	}
	return true
}

// parseEntry reads an entry's hint: task_id and version are required;
// project_id and user_id are dropped when not valid ids (the snapshot
// says).
func parseEntry(tenant string, m redis.XMessage) (snapshot.Notification, bool) {
	n := snapshot.Notification{TenantID: tenant}
	n.TaskID, _ = m.Values["task_id"].(string)
	v, _ := m.Values["version"].(string)
	var err error
	if n.Version, err = strconv.ParseInt(v, 10, 64); err != nil || n.Version <= 0 || !snapshot.ValidID(n.TaskID) {
		return n, false
	}
	if p, _ := m.Values["project_id"].(string); snapshot.ValidID(p) {
		n.ProjectID = p
	}
	if u, _ := m.Values["user_id"].(string); snapshot.ValidID(u) {
		n.UserID = u
	}
	if o, _ := m.Values["occurred_at"].(string); o != "" {
		n.OccurredAt, _ = strconv.ParseInt(o, 10, 64)
	}
	return n, true
}
