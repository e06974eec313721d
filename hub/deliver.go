package hub

import (
	"context"
	"errors"
	"time"

	"github.com/pushd/pushd/snapshot"
)

// writeLoop is one of the pool's writers. A connection is owned by the
// writer that popped it until flush returns, or, when its sink queued the
// write, by the sink until it calls Conn.Drained: each connection has
// exactly one writer at a time, and no writer waits for a client.
func (h *Hub) writeLoop() {
	defer h.wg.Done()
	var buf []Event
	for {
		c, ok := h.runq.pop()
		if !ok {
			return
		}
		buf = h.flush(c, buf[:0])
	}
}

// flush writes everything pending on c in one Write, then requeues c if more
// arrived meanwhile.
func (h *Hub) flush(c *Conn, buf []Event) []Event {
	c.writeMu.Lock()
	c.mu.Lock()
	if c.closed || c.ending {
		c.scheduled = false
		c.mu.Unlock()
		c.writeMu.Unlock()
		return buf
	}
	buf, complete := c.takeLocked(buf)
	endAfter, reason := c.endAfter && complete, c.endReason
	// Set before the write: the sink may call Drained before Write returns.
	c.parked = parking{on: true, end: endAfter, reason: reason}
	c.mu.Unlock()

	patches := 0
	if c.Deltas {
		// Made here, outside c.mu: a patch is made once per version and
		// base, by the first writer that needs it.
		for i := range buf {
			if b := buf[i].base; b != nil {
				if buf[i].Patch = buf[i].Snapshot.PatchFrom(b); buf[i].Patch != nil {
					patches++
				}
			}
		}
	}
	var queued bool
	var err error
	if len(buf) > 0 {
		queued, err = c.sink.Write(buf)
	}
	c.writeMu.Unlock()

	// One clock reading per flush, however many events it wrote.
	now := time.Now().UnixNano()
	tasks := 0
	for i := range buf {
		if buf[i].Kind == KindTask {
			tasks++
			if err == nil {
				h.observe(&buf[i], now)
			}
		}
		if buf[i].Kind == KindHeartbeat {
			h.stats.heartbeats.Add(1)
		}
		buf[i] = Event{} // drop snapshot references
	}
	if err == nil {
		h.stats.delivered.Add(int64(tasks))
		if patches > 0 {
			h.stats.patches.Add(int64(patches))
		}
		h.stats.pushed[c.Transport].Add(int64(tasks))
		c.lastWrite.Store(now)
	}
	if queued && err == nil {
		// The sink owns the connection until Drained, which resumes it.
		h.stats.backlogged.Add(1)
		return buf
	}
	// One lock round trip unparks the connection and, on the common path,
	// decides whether it goes back to the writers.
	c.mu.Lock()
	c.parked = parking{}
	if err != nil || endAfter {
		c.mu.Unlock()
		if err != nil {
			h.writeFailed(c, err)
		} else {
			h.endAfterWrite(c, reason)
		}
		return buf
	}
	again := c.resumeLocked()
	c.mu.Unlock()
	if again {
		h.runq.push(c)
	}
	return buf
}

// Drained is how a sink that queued a write hands the connection back: err
// is nil once the queued bytes are written, and ends the connection
// otherwise (a client that read nothing for the write timeout, or a closed
// socket).
func (c *Conn) Drained(err error) {
	h := c.hub
	c.mu.Lock()
	p := c.parked
	c.parked = parking{}
	gone := c.closed || c.ending // a write cut by the close, not a slow client
	c.mu.Unlock()
	switch {
	case gone:
	case err != nil:
		h.writeFailed(c, err)
	case !p.on:
		// Not a write the hub queued (a transport's own control frame).
	case p.end:
		h.endAfterWrite(c, p.reason)
	default:
		c.resume()
	}
}

// resume gives c back to the writers if more arrived while it was written,
// and otherwise marks it unscheduled.
func (c *Conn) resume() {
	c.mu.Lock()
	again := c.resumeLocked()
	c.mu.Unlock()
	if again {
		c.hub.runq.push(c)
	}
}

// resumeLocked marks c unscheduled unless it has more to write, and reports
// whether the caller must give it back to the writers.
func (c *Conn) resumeLocked() bool {
	again := !c.closed && !c.ending && c.hasWorkLocked()
	if !again {
		c.scheduled = false
	}
	return again
}

func (h *Hub) writeFailed(c *Conn, err error) {
	h.cut(CutWriteFailed)
	h.log.Debug("write failed; closing", "conn", c.ID, "tenant", c.TenantID, "err", err)
	c.end(CloseWriteFailed)
}

func (h *Hub) endAfterWrite(c *Conn, reason CloseReason) {
	if reason == CloseTokenExpired {
		h.cut(CutTokenExpired)
	}
	c.end(reason)
}

// observe measures a task event written at now (Unix ns).
func (h *Hub) observe(ev *Event, now int64) {
	if ev.news.heard > 0 {
		h.stats.notifyToWrite.Observe(time.Duration(now - ev.news.heard))
	}
	if ev.news.live && ev.Snapshot.UpdatedAt > 0 {
		h.stats.staleness.Observe(time.Duration(now - ev.Snapshot.UpdatedAt*int64(time.Millisecond)))
	}
}

// readBatch is the most tasks one dispatcher reads together.
const readBatch = 64

// dispatchLoop reads the snapshots that notifications announce and offers
// them to the connections that watch them. Tasks queued together are read
// together: one MGET (or pipeline) and one wake-up for the lot.
func (h *Hub) dispatchLoop() {
	defer h.wg.Done()
	var (
		targets []*Conn
		batch   []notice
		keys    []key
		ids     []string
		ok      bool
	)
	for {
		batch, keys, ok = h.dispatch.popBatch(batch, keys, readBatch)
		if !ok {
			return
		}
		h.observeQueued(batch)
		if len(batch) == 1 {
			targets = h.deliver(batch[0], targets)
			continue
		}
		targets, ids = h.deliverBatch(batch, targets, ids)
	}
}

// observeQueued measures how long each task of a batch a dispatcher took
// waited for it since its notification was heard.
func (h *Hub) observeQueued(batch []notice) {
	now := time.Now().UnixNano()
	for _, n := range batch {
		if n.heard > 0 {
			h.stats.notifyQueued.Observe(time.Duration(now - n.heard))
		}
	}
}

// deliver reads one announced task and offers it to its watchers.
func (h *Hub) deliver(n notice, targets []*Conn) []*Conn {
	// No per-read timeout here: the source bounds its own fetches, and a
	// context per notification would be the delivery path's only allocation.
	// Nor a cancel: a context that never ends lets the store read on this
	// goroutine rather than one of its own per read; Close waits out at
	// most one bounded fetch per dispatcher.
	start := time.Now()
	snap, err := h.cfg.Source.Get(context.Background(), n.id, n.version)
	h.stats.notifyRead.Observe(time.Since(start))
	h.stats.fetches.Add(1)
	if err != nil {
		if !errors.Is(err, snapshot.ErrNotFound) {
			h.stats.fetchErrors.Add(1)
			h.log.Warn("snapshot read for notification failed", "tenant", n.tenant, "task", n.id, "err", err)
		}
		return targets
	}
	return h.offerRead(n, snap, targets)
}

// deliverBatch reads several announced tasks with one GetMany and offers
// each to its watchers. A task read older than announced (Redis lost the
// write) or not at all (GetMany trusts the negative cache, which a read
// begun before the write may have filled) is read again alone, by Get,
// which knows where to look for the rest: a batch never delivers less than
// its tasks read one by one would.
func (h *Hub) deliverBatch(batch []notice, targets []*Conn, ids []string) ([]*Conn, []string) {
	ids = ids[:0]
	for _, n := range batch {
		ids = append(ids, n.id)
	}
	h.stats.batchedReads.Add(1)
	start := time.Now()
	snaps, err := h.cfg.Source.GetMany(context.Background(), ids)
	h.stats.notifyRead.Observe(time.Since(start))
	clear(ids)
	for _, n := range batch {
		// On an error each task is read alone, as if it came by itself: one
		// bad id must not cost the others their delivery.
		if snap := snaps[n.id]; err == nil && snap != nil && snap.Version >= n.version {
			h.stats.fetches.Add(1)
			targets = h.offerRead(n, snap, targets)
		} else {
			targets = h.deliver(n, targets)
		}
	}
	return targets, ids
}

// offerRead offers snap, read for notice n, to its watchers.
func (h *Hub) offerRead(n notice, snap *snapshot.Snapshot, targets []*Conn) []*Conn {
	if snap.TenantID != n.tenant {
		// A notification on one tenant's channel for another tenant's task.
		h.drop(DropTenant)
		return targets
	}
	h.noteRead(snap, ReadHint)
	return h.offerToWatchers(snap, news{heard: n.heard, live: true}, targets[:0])
}

// offerToWatchers offers s to every local connection of its tenant that
// watches it: by task, by project or by user. targets is scratch space.
func (h *Hub) offerToWatchers(s *snapshot.Snapshot, n news, targets []*Conn) []*Conn {
	targets = h.watchersOf(s, targets)
	// The connections the offers scheduled go to the writers together: one
	// run queue lock per notification instead of one per connection.
	ready := 0
	for _, c := range targets {
		// A connection listed twice gets it once: offer drops equal versions.
		if c.offerDeferred(s, n) {
			targets[ready] = c
			ready++
		}
	}
	h.runq.pushAll(targets[:ready])
	clear(targets)
	return targets
}

// watchersOf appends to targets the local connections of s's tenant that
// may watch it: by task, by project or by user. A connection may be listed
// twice.
func (h *Hub) watchersOf(s *snapshot.Snapshot, targets []*Conn) []*Conn {
	targets = h.idx.collect(byTask, key{s.TenantID, s.TaskID}, targets)
	if s.ProjectID != "" {
		targets = h.idx.collect(byProject, key{s.TenantID, s.ProjectID}, targets)
	}
	if s.UserID != "" {
		targets = h.idx.collect(byUser, key{s.TenantID, s.UserID}, targets)
	}
	return targets
}

// watched reports whether any local connection may want the task, so
// notifications nobody here watches cost no read.
func (h *Hub) watched(k key, projectID, userID string) bool {
	if h.idx.has(byTask, k) {
		return true
	}
	if !h.idx.scopedIn(k.tenant) {
		return false
	}
	if projectID == "" || userID == "" {
		return true // the notification does not say; the snapshot will
	}
	return h.idx.has(byProject, key{k.tenant, projectID}) || h.idx.has(byUser, key{k.tenant, userID})
}

// tickLoop writes heartbeats to idle connections and ends connections whose
// token expired. One goroutine scans them all, so an idle connection needs
// no timer of its own.
func (h *Hub) tickLoop() {
	defer h.wg.Done()
	t := time.NewTicker(h.tickInterval())
	defer t.Stop()
	for {
		select {
		case <-h.ctx.Done():
			return
		case now := <-t.C:
			h.tick(now)
		}
	}
}

func (h *Hub) tickInterval() time.Duration {
	return min(h.cfg.HeartbeatInterval/2, time.Second)
}

func (h *Hub) tick(now time.Time) {
	h.budgets.sweep(now)
	idle := now.Add(-h.cfg.HeartbeatInterval).UnixNano()
	for _, c := range h.allConns() {
		c.mu.Lock()
		expired := !c.ExpiresAt.IsZero() && now.After(c.ExpiresAt)
		c.mu.Unlock()
		if expired || (c.Hold != nil && c.Hold.Revoked()) {
			c.expire()
			continue
		}
		if c.lastWrite.Load() <= idle {
			c.mu.Lock()
			if !c.closed && !c.ending && !c.heartbeat {
				c.heartbeat = true
				c.scheduleLocked()
			}
			c.mu.Unlock()
		}
		if c.syncWaiting.Load() && h.cfg.Stream.Position(c.TenantID) != "" {
			c.mu.Lock()
			if !c.closed && !c.ending && c.syncPending {
				c.syncWaiting.Store(false) // work again, for a writer holding it now too
				c.scheduleLocked()
			}
			c.mu.Unlock()
		}
	}
}
