package hub

import (
	"errors"
	"math"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pushd/pushd/snapshot"
)

// Conn is one client connection as the hub sees it. Transports create it
// with Hub.Open and end it with Close.
type Conn struct {
	ID string
	Principal

	hub  *Hub
	sink Sink

	lastWrite atomic.Int64 // Unix ns of the last successful write; read by the ticker
	// syncWaiting: a take found syncPending but no Stream position yet, so
	// the sync is no work until the ticker finds one and schedules the
	// connection; it does not wait for an unrelated write. Written under
	// c.mu; the ticker reads it without.
	syncWaiting atomic.Bool

	closeOnce sync.Once

	// writeMu is held by the writer that owns the connection while it
	// writes, and by Close to wait out a write in flight.
	writeMu sync.Mutex

	mu       sync.Mutex // guards the fields below
	tasks    idSet
	projects idSet
	track    trackSet   // per task: the version last taken for writing, the outbox's one snapshot
	order    []*tracked // entries with a snapshot pending, oldest first, at most maxTracked: a take needs no lookup
	// sent is, with Principal.Deltas, the snapshot last taken for writing
	// of each tracked task, the base of the next one's patch; nil without.
	sent    map[string]*snapshot.Snapshot
	control []Event // hello, errors and mode changes, in order, before tasks
	trailer []Event // acks, after the tasks queued before them
	// The mode and reason the client was told last (hello or mode event);
	// "" until the hello is queued.
	toldMode, toldReason string
	busRelease           func()
	reconnect            int32 // > 0: tell the client to reconnect after this many ms, then end
	// resumedAt is when the stream entry of the cursor a Subscribe was
	// replayed after was written, in whole Unix seconds of Redis's clock
	// (rounded down, so earlier); 0 if none. With reconnect, it fills
	// the eight bytes reconnect alone took.
	resumedAt uint32
	parked    parking // a write in flight, and what to do once a queued one drains
	endReason CloseReason
	userScope bool
	heartbeat bool // write a heartbeat if nothing else is pending
	scheduled bool // queued for, or held by, a writer or a sink's queued write
	endAfter  bool // end the connection once what is pending is written
	resumed   bool // counted in Stats.Reconnects
	reading   bool // a Subscribe is reading its initial state
	ending    bool
	closed    bool
	// Resume cursors (Subscription.Cursors, with a Stream). cursors: the
	// transport writes them. settled: no Subscribe is reading its initial
	// state, so the tenant's stream position holds for everything the
	// connection watches. syncPending: write a KindSync with the position
	// once there is one, after the tasks pending.
	cursors     bool
	settled     bool
	syncPending bool
	// The bools are together: spread among the other fields, their padding
	// took a size class of its own (see TestConnSize).
}

// parking is the state of a connection's write in flight: the sink may
// queue it and call Drained later, which then ends the connection if the
// write carried its last events.
type parking struct {
	on     bool
	end    bool
	reason CloseReason
}

// tracked is what a connection keeps of one task. An entry has a
// delivered version, a pending snapshot or both; it is in Conn.order
// exactly when snap is not nil.
type tracked struct {
	id        string
	delivered int64              // the last version taken for writing, 0 if none or forgotten
	snap      *snapshot.Snapshot // pending in the outbox, nil if none
	// How snap came (news), for the delivery histograms: its two fields
	// apart, so that sent fits in the padding after live, where a nested
	// news would round the entry up to the next size class (TestTrackedSize).
	heard int64
	live  bool
	// sent is when delivered was taken for writing (Hub.sentStamp), for
	// an operator's inspection; 0 when the version was recorded without
	// a write (a resumed client had it) or is none.
	sent uint32
}

// setNews records how the pending snapshot came.
func (t *tracked) setNews(n news) { t.heard, t.live = n.heard, n.live }

// news is how the pending snapshot came.
func (t *tracked) news() news { return news{heard: t.heard, live: t.live} }

// ErrOtherPrincipal: a refresh's token names another user or tenant than
// the connection's.
var ErrOtherPrincipal = errors.New("hub: the token is another user's or tenant's")

// Refresh gives the connection a new token's expiry and grant, checked by
// the caller like the first token: the connection then ends at the new
// expiry, sees what the new grant allows from the next delivery on, and
// answers to the new token's session (empty for a JWT) instead of the
// first's: its logout ends the connection, the old one's no longer does.
// A token of another user or tenant is refused with ErrOtherPrincipal.
func (c *Conn) Refresh(p Principal, session string) error {
	if p.TenantID != c.TenantID || p.UserID != c.UserID {
		return ErrOtherPrincipal
	}
	c.mu.Lock()
	if c.closed || c.ending {
		c.mu.Unlock()
		return ErrClosed
	}
	c.ExpiresAt, c.Grant = p.ExpiresAt, p.Grant
	c.mu.Unlock()
	// Outside c.mu: a Close racing this releases the Hold, and a Hold
	// released binds nothing again.
	if c.Hold != nil {
		c.Hold.Rebind(session)
	}
	c.hub.stats.refreshes.Add(1)
	return nil
}

// sees is Sees under c.mu, which guards the grant.
func (c *Conn) sees(s *snapshot.Snapshot) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.Sees(s)
}

// watchesLocked reports whether the connection still wants s.
func (c *Conn) watchesLocked(s *snapshot.Snapshot) bool {
	return c.tasks.has(s.TaskID) ||
		(s.ProjectID != "" && c.projects.has(s.ProjectID)) ||
		(c.userScope && s.UserID == c.UserID)
}

// offer queues s for the connection unless it has, or has pending, that
// version or a newer one. It never blocks: a pending older snapshot of the
// task is replaced, so a slow client holds at most one per task.
func (c *Conn) offer(s *snapshot.Snapshot, n news) {
	if c.offerDeferred(s, n) {
		c.hub.runq.push(c)
	}
}

// offerDeferred is offer for a caller that queues connections for the
// writers itself: it reports whether the offer scheduled c, which the
// caller must then push to the run queue.
func (c *Conn) offerDeferred(s *snapshot.Snapshot, n news) (push bool) {
	push, _, _ = c.offerTracked(s, n)
	return push
}

// offerTracked is offerDeferred that also reports whether the outbox took
// s and the version of its task the connection held before (delivered or
// pending; 0 for none). While a Subscribe reads its initial state, it
// reports s not taken: those reads send the client the task's current
// state anyway, so a repair round that gets there first found nothing
// the client lacked.
//
// A connection that resumed from a stream cursor holds a version of every
// task it watches, and knows only those of the tasks the stream holds
// changes of shortly before or after the cursor (Conn.replay). A task's
// state read again (n.reread) that it has no record of and that was
// written well before the cursor's entry (resumeMargin) is one the client
// has: the previous connection's own repair rounds would have brought it.
// It is recorded as delivered without a write. News of a change is always
// offered, and so is a later state: it may be a change the stream lacks.
func (c *Conn) offerTracked(s *snapshot.Snapshot, n news) (push, taken bool, had int64) {
	h := c.hub
	c.mu.Lock()
	switch {
	case c.closed || c.ending:
		c.mu.Unlock()
		return false, false, 0
	case s.TenantID != c.TenantID: // checked on every delivery, not only at subscribe
		c.mu.Unlock()
		h.drop(DropTenant)
		return false, false, 0
	case !c.Grant.Allows(c.UserID, s): // a task moved out of a granted project stops here
		c.mu.Unlock()
		h.drop(DropGrant)
		return false, false, 0
	case !c.watchesLocked(s):
		c.mu.Unlock()
		return false, false, 0
	}
	t := c.track.get(s.TaskID)
	if t != nil {
		had = t.delivered
	}
	switch {
	case n.reread && t == nil && c.resumedAt > 0 && s.UpdatedAt < int64(c.resumedAt)*1000-h.resumeMargin().Milliseconds():
		c.rememberLocked(s.TaskID, s.Version)
		c.mu.Unlock()
		return false, false, 0
	case !s.NewerThan(had):
		c.mu.Unlock()
		h.drop(DropStale)
		return false, false, had
	case t != nil && t.snap != nil:
		had = t.snap.Version
		if !s.NewerThan(had) {
			c.mu.Unlock()
			h.drop(DropStale)
			return false, false, had
		}
		h.stats.conflated.Add(1)
	default:
		if len(c.order) >= h.maxTracked() {
			// More distinct tasks waiting than the connection can watch at
			// once (a scope whose tasks come and go faster than the client
			// reads): the client is too slow to hold them.
			h.cut(CutSlow)
			c.endLocked(CloseWriteFailed)
			c.mu.Unlock()
			return false, false, had
		}
		if t == nil {
			t = c.trackLocked(s.TaskID)
		}
		c.order = append(c.order, t)
	}
	t.snap = s
	t.setNews(n)
	push = c.markScheduledLocked()
	taken = !c.reading
	c.mu.Unlock()
	return push, taken, had
}

// Send queues a non-task event (an error for a refused subscription, say).
func (c *Conn) Send(ev Event) { c.sendControl(ev) }

func (c *Conn) sendControl(ev Event) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.sendControlLocked(ev)
}

// syncMode tells the client its mode (Hub.modeOf its tenant) if that is
// not what it was told last. The mode is read under c.mu, so of two
// concurrent calls the later one's reading is the one told last; a
// connection whose hello is not queued yet is told by its hello.
func (c *Conn) syncMode() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.toldMode == "" {
		return
	}
	mode, reason := c.hub.modeOf(c.TenantID)
	if mode == c.toldMode && (mode == ModePush || reason == c.toldReason) {
		return
	}
	if mode == ModePush {
		reason = ReasonRestored // push has a reason only as a switch back
	}
	c.toldMode, c.toldReason = mode, reason
	c.sendControlLocked(Event{Kind: KindMode, Mode: mode, Reason: reason})
}

func (c *Conn) sendControlLocked(ev Event) {
	if c.closed || c.ending {
		return
	}
	if ev.Kind == KindMode {
		// Only the latest mode matters.
		for i := range c.control {
			if c.control[i].Kind == KindMode {
				c.control = append(c.control[:i], c.control[i+1:]...)
				break
			}
		}
	}
	if len(c.control)+len(c.trailer) >= c.hub.cfg.MaxControl {
		c.hub.cut(CutSlow)
		c.endLocked(CloseWriteFailed)
		return
	}
	if ev.Kind == KindAck {
		c.trailer = append(c.trailer, ev)
	} else {
		c.control = append(c.control, ev)
	}
	c.scheduleLocked()
}

// scheduleLocked queues the connection for a writer unless it is queued
// already. The queue push never blocks.
func (c *Conn) scheduleLocked() {
	if c.markScheduledLocked() {
		c.hub.runq.push(c)
	}
}

// markScheduledLocked marks c scheduled and reports whether it was not
// already, in which case the caller must push it to the run queue.
func (c *Conn) markScheduledLocked() bool {
	if c.scheduled {
		return false
	}
	c.scheduled = true
	return true
}

// takeLocked moves what is pending into buf for one write, marking each task
// version delivered so nothing older or equal is queued after it; complete
// is false when tasks were left for the next write (maxBatchBytes).
//
// The stream position is read first: whatever it covers was offered to the
// connection before this take, so it is in buf or was written already. Only
// the last task event of buf carries it; a client that got the events
// before it but not it still holds the previous one.
func (c *Conn) takeLocked(buf []Event) (_ []Event, complete bool) {
	var position string
	if c.cursors && c.settled {
		position = c.hub.cfg.Stream.Position(c.TenantID)
	}
	buf = append(buf, c.control...)
	c.control = nil // rare (hello, errors, modes): an idle connection keeps no slice
	lastTask := -1
	taken, size := 0, 0
	var sent uint32 // one clock reading per take, on the first task taken
	for _, t := range c.order {
		if size >= maxBatchBytes {
			break // the rest waits for the next turn: see maxBatchBytes
		}
		taken++
		s, n := t.snap, t.news()
		t.snap = nil
		t.setNews(news{})
		if !c.Sees(s) || !s.NewerThan(t.delivered) {
			if t.delivered == 0 {
				c.forgetLocked(t.id)
			}
			continue
		}
		if sent == 0 {
			sent = c.hub.sentStamp()
		}
		ev := Event{Kind: KindTask, Snapshot: s, news: n}
		if c.Deltas {
			ev.base = c.sentLocked(t.id, t.delivered, s)
		}
		t.delivered, t.sent = s.Version, sent
		lastTask = len(buf)
		size += len(s.JSON())
		buf = append(buf, ev)
	}
	rest := copy(c.order, c.order[taken:])
	clear(c.order[rest:])
	c.order = c.order[:rest]
	if rest > 0 {
		// The position, acks and a reconnect come after every task queued
		// before them: they wait for the rest.
		return buf, false
	}
	if position != "" {
		if lastTask >= 0 {
			buf[lastTask].Cursor = position
			c.syncPending = false // the task event carries it
		}
		if c.syncPending {
			buf = append(buf, Event{Kind: KindSync, Cursor: position})
			c.syncPending = false
		}
	}
	c.syncWaiting.Store(c.syncPending && c.settled)
	buf = append(buf, c.trailer...)
	c.trailer = nil
	if c.reconnect > 0 {
		buf = append(buf, Event{Kind: KindReconnect, AfterMS: int(c.reconnect)})
		c.reconnect = 0
	}
	if len(buf) == 0 && c.heartbeat {
		buf = append(buf, Event{Kind: KindHeartbeat})
	}
	c.heartbeat = false
	return buf, true
}

// maxBatchBytes bounds the snapshots one write takes from an outbox (a
// subscription's initial state can be hundreds of tasks). The rest waits
// for the connection's next turn, behind every other connection queued
// meanwhile: a big batch neither holds a writer for long nor lands in one
// buffer, and a client that stops reading has at most this much in its
// backlog.
const maxBatchBytes = 128 << 10

// maxTracked bounds the tasks a connection keeps a delivered version or a
// pending snapshot of: every task it can watch by id, and a full listing.
func (h *Hub) maxTracked() int { return h.cfg.MaxSubscriptions + snapshot.MaxList }

// sentLocked records s as the snapshot of its task taken for writing and
// returns the one taken before it, if that is the version the connection
// holds (delivered): a version recorded without a write (a resume) has no
// snapshot here, and its next change goes whole.
func (c *Conn) sentLocked(id string, delivered int64, s *snapshot.Snapshot) *snapshot.Snapshot {
	if c.sent == nil {
		c.sent = make(map[string]*snapshot.Snapshot)
	}
	base := c.sent[id]
	c.sent[id] = s
	if base == nil || base.Version != delivered {
		return nil
	}
	return base
}

// forgetLocked drops what the connection keeps of task id.
func (c *Conn) forgetLocked(id string) {
	c.track.remove(id)
	delete(c.sent, id)
}

// rememberLocked records v as the version of task id taken for writing.
func (c *Conn) rememberLocked(id string, v int64) {
	t := c.track.get(id)
	if t == nil {
		t = c.trackLocked(id)
	}
	t.delivered, t.sent = v, 0
}

// trackLocked adds an entry for task id, which has none. Past maxTracked,
// the entry of another task is forgotten to make room: one with nothing
// pending that the connection does not watch by id (in a map, picked by its
// random iteration start). A forgotten task's next change is newer than
// what was sent, so it is delivered as it should be; only a resend of the
// version sent could follow, and the store never hands out an older one.
// (Pending entries are at most maxTracked and never forgotten, nor are the
// tasks watched by id: with both, the map holds at most twice maxTracked.)
func (c *Conn) trackLocked(id string) *tracked {
	if c.track.len() >= c.hub.maxTracked() {
		if id, ok := c.track.evictOne(func(t *tracked) bool { return t.snap != nil || c.tasks.has(t.id) }); ok {
			delete(c.sent, id)
		}
	}
	t := &tracked{id: id}
	c.track.put(t)
	return t
}

// dropPendingLocked empties the outbox of tasks.
func (c *Conn) dropPendingLocked() {
	for _, t := range c.order {
		t.snap = nil
		t.setNews(news{})
		if t.delivered == 0 {
			c.forgetLocked(t.id)
		}
	}
	c.order = nil
}

// hasWorkLocked reports whether a take would find something to write. A
// pending sync counts until a take found no position for it: settle may
// come while a write is in flight, whose writer must then take it.
func (c *Conn) hasWorkLocked() bool {
	return len(c.order) > 0 || len(c.control) > 0 || len(c.trailer) > 0 || c.reconnect > 0 || c.heartbeat ||
		(c.syncPending && c.settled && !c.syncWaiting.Load())
}

// drain tells the client to reconnect after a random delay of up to
// maxAfter, then ends the connection.
func (c *Conn) drain(maxAfter time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed || c.ending {
		return
	}
	c.reconnect = 1 + rand.Int32N(int32(min(max(maxAfter, time.Millisecond), math.MaxInt32*time.Millisecond)/time.Millisecond))
	c.endAfter, c.endReason = true, CloseDraining
	c.scheduleLocked()
}

// expire tells the client its token expired, then ends the connection.
func (c *Conn) expire() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed || c.ending || c.endAfter {
		return
	}
	c.control = append(c.control, Event{Kind: KindError, Code: CodeTokenExpired, Message: "the token expired; reconnect with a fresh one"})
	c.endAfter, c.endReason = true, CloseTokenExpired
	c.scheduleLocked()
}

// RefuseToken tells the client why a token it sent on the connection (a
// refresh) was refused, an error event of code, then ends the connection
// with CloseTokenRefused.
func (c *Conn) RefuseToken(code, message string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed || c.ending || c.endAfter {
		return
	}
	c.control = append(c.control, Event{Kind: KindError, Code: code, Message: message})
	c.endAfter, c.endReason = true, CloseTokenRefused
	c.scheduleLocked()
}

// Flooded ends a connection whose client sent more than its transport
// allows of what the transport answers by itself (WebSocket pings and
// pongs), at once, with CloseFlooded; it is counted.
func (c *Conn) Flooded() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed || c.ending {
		return
	}
	c.hub.cut(CutFlooded)
	c.endLocked(CloseFlooded)
}

// end asks the transport to close the connection.
func (c *Conn) end(reason CloseReason) {
	c.mu.Lock()
	c.endLocked(reason)
	c.mu.Unlock()
}

func (c *Conn) endLocked(reason CloseReason) {
	if c.closed || c.ending {
		return
	}
	c.ending = true
	c.dropPendingLocked()
	c.control, c.trailer = nil, nil
	// Closed only signals the transport; calling it under c.mu is safe
	// because it must not block or call back into the hub.
	c.sink.Closed(reason)
}

// Close removes the connection from the hub. The transport calls it when
// the client is gone or after the hub ended the connection; once it
// returns, the hub never calls the sink again. It is idempotent.
func (c *Conn) Close() {
	c.closeOnce.Do(func() {
		h := c.hub
		h.mu.Lock()
		c.mu.Lock()
		c.closed = true
		watched := make([]watch, 0, c.tasks.len()+c.projects.len()+1)
		c.tasks.each(func(id string) {
			h.idx.remove(byTask, key{c.TenantID, id}, c)
			watched = append(watched, watch{byTask, id})
		})
		c.projects.each(func(id string) {
			h.idx.remove(byProject, key{c.TenantID, id}, c)
			watched = append(watched, watch{byProject, id})
		})
		if c.userScope {
			h.idx.remove(byUser, key{c.TenantID, c.UserID}, c)
			watched = append(watched, watch{by: byUser})
		}
		if c.projects.len() > 0 || c.userScope {
			h.idx.addScoped(c.TenantID, -1)
		}
		c.dropPendingLocked()
		c.control, c.trailer = nil, nil
		release := c.busRelease
		c.busRelease = nil
		c.mu.Unlock()
		delete(h.conns, c)
		h.unclassLocked(connClass{c.Transport, c.Plan})
		if s := c.Slot; s != nil && s.opened && !s.done {
			s.done = true
			h.uncountLocked(s.ip)
		}
		h.stats.closed.Add(1)
		h.log.Debug("connection closed", "conn", c.ID, "tenant", c.TenantID)
		if h.closing && len(h.conns) == 0 && h.empty != nil {
			close(h.empty)
			h.empty = nil
		}
		h.mu.Unlock()

		// Wait out a write in flight, then let go of the transport.
		c.writeMu.Lock()
		c.sink = nil
		c.writeMu.Unlock()
		h.forgetConn(c)
		h.budgets.closed(key{c.TenantID, c.UserID}, watched, time.Now())
		if release != nil {
			release()
		}
		if c.Hold != nil {
			c.Hold.Release()
		}
	})
}
