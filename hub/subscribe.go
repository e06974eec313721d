package hub

import (
	"context"
	"errors"
	"slices"
	"time"

	"github.com/pushd/pushd/internal/httperr"
	"github.com/pushd/pushd/snapshot"
	"github.com/pushd/pushd/stream/cursor"
)

// Subscription is what a client asks to watch.
type Subscription struct {
	Tasks    []string
	Projects []string
	User     bool             // every task of the connection's user
	Since    map[string]int64 // per task, the version the client already has
	// Resume is a cursor of the hub's Stream the client resumes from
	// (SSE's Last-Event-ID): when the stream can replay what changed after
	// it, only those tasks are read and sent; otherwise, or without a
	// Stream, everything is, as for a new client.
	Resume string
	// ResumeMismatch says the client brought a stream cursor the transport
	// would not resume from, as it was issued for another subscription:
	// the client is one coming back, but is read everything, as a new
	// client is, and the cursor is counted as a fallback.
	ResumeMismatch bool
	// Cursors asks for Stream positions on task events and a KindSync event
	// once the initial state is complete: the transport writes them as
	// resume cursors. Without a Stream it does nothing.
	Cursors bool
}

// Rejection is a refused part of a subscription. Exactly one of TaskID and
// ProjectID is set.
type Rejection struct {
	TaskID    string `json:"task_id,omitempty"`
	ProjectID string `json:"project_id,omitempty"`
	Code      string `json:"code"`
	// RetryAfter (whole seconds, rounded up) and RetryAfterMS, with
	// CodeRateLimitExceeded, are when to ask again.
	RetryAfter   int64 `json:"retry_after,omitempty"`
	RetryAfterMS int64 `json:"retry_after_ms,omitempty"`
}

// Subscribe adds s to what the connection watches and queues the current
// snapshot of each newly watched task. The connection is indexed and the
// tenant's bus subscription confirmed before any snapshot is read, so no
// change can fall between the two.
//
// A task that does not exist, or belongs to another tenant (the two are
// answered alike), is rejected with not_found but stays watched: a task
// created after the client asked for it still reaches the client.
func (c *Conn) Subscribe(ctx context.Context, s Subscription) ([]Rejection, error) {
	a, err := c.admit(s)
	if err != nil {
		return nil, err
	}
	defer c.readDone()
	if a.needBus {
		if err := c.joinBus(ctx); err != nil {
			return a.rejected, err
		}
	}
	switch replayed, err := c.replayResume(ctx, s, a); {
	case err != nil:
		return a.rejected, err
	case replayed:
		c.settle(true)
		return a.rejected, nil
	}
	err = c.readInitial(ctx, a)
	unread := slices.ContainsFunc(a.rejected, unreadable)
	if err == nil {
		c.settle(!unread)
	}
	// A read that fails or is cut short is not the client's loss to wait
	// out until the task next changes, which a finished task never does:
	// the poll loop re-reads the tenant's watched tasks until it succeeds.
	if err != nil || unread {
		c.hub.poll.retry(c.TenantID, c.hub.pollWait(0))
	}
	return a.rejected, err
}

// admission is one Subscribe's: what it added to the connection's watches,
// for the reads that follow, and what it refused.
type admission struct {
	room   int // subscriptions the connection may still add
	budget readBudget

	tasks    []string // watched by id, newly
	projects []string // watched, newly
	user     bool     // the user's tasks watched, newly
	rejected []Rejection
	needBus  bool // the connection holds no bus reference yet
}

// admit validates s, takes the reads it costs from the user's budget and
// indexes what it adds, all under c.mu, so a concurrent Close sees every
// entry. It also records what the client says it holds, counts a client
// coming back, and leaves the connection unsettled until the Subscribe has
// offered the initial state.
func (c *Conn) admit(s Subscription) (*admission, error) {
	h := c.hub
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed || c.ending {
		return nil, ErrClosed
	}
	a := &admission{
		room:   h.cfg.MaxSubscriptions - c.tasks.len() - c.projects.len(),
		budget: readBudget{h: h, k: key{c.TenantID, c.UserID}, now: time.Now()},
	}
	c.admitTasksLocked(a, s.Tasks)
	c.admitProjectsLocked(a, s.Projects)
	if s.User {
		c.admitUserLocked(a)
	}
	c.acceptSinceLocked(s.Since)
	// A client that brings a resume position is one coming back: counted
	// once per connection, however many subscribes carry one.
	if !c.resumed && (s.Resume != "" || s.ResumeMismatch || len(s.Since) > 0) {
		c.resumed = true
		h.stats.reconnects[c.Transport].Add(1)
	}
	a.needBus = c.busRelease == nil
	// Until this Subscribe has offered the initial state, the stream
	// position says nothing about what it adds.
	c.settled = false
	c.reading = true
	// A stream cursor says the client has every change of what it
	// watches; a client refused part of its subscription comes back for
	// it, and a cursor of this connection would then skip it if it never
	// moved. Such a connection writes the transport's own cursors.
	if s.Cursors && h.cfg.Stream != nil && !slices.ContainsFunc(a.rejected, unwatched) {
		c.cursors = true
	}
	return a, nil
}

// readDone ends a Subscribe's initial reads: a repair round that offers
// the connection a task from now on counts if the client lacked it.
func (c *Conn) readDone() {
	c.mu.Lock()
	c.reading = false
	c.mu.Unlock()
}

// admitTasksLocked watches the tasks of ids it admits, in order.
func (c *Conn) admitTasksLocked(a *admission, ids []string) {
	h := c.hub
	for _, id := range ids {
		switch {
		case !snapshot.ValidID(id):
			a.rejected = append(a.rejected, Rejection{TaskID: id, Code: CodeInvalidID})
		case c.tasks.has(id):
		case a.room <= 0:
			a.rejected = append(a.rejected, Rejection{TaskID: id, Code: CodeTooMany})
		case !c.readIsFreeLocked(id) && !a.budget.take(watch{byTask, id}):
			a.rejected = append(a.rejected, a.budget.refuse(Rejection{TaskID: id}))
		default:
			a.room--
			c.tasks.add(id)
			h.idx.add(byTask, key{c.TenantID, id}, c)
			a.tasks = append(a.tasks, id)
		}
	}
}

// admitProjectsLocked watches the projects of ids it admits, in order.
func (c *Conn) admitProjectsLocked(a *admission, ids []string) {
	h := c.hub
	for _, id := range ids {
		switch {
		case !snapshot.ValidID(id):
			a.rejected = append(a.rejected, Rejection{ProjectID: id, Code: CodeInvalidID})
		case c.projects.has(id):
		case a.room <= 0:
			a.rejected = append(a.rejected, Rejection{ProjectID: id, Code: CodeTooMany})
		case !c.listIsFreeLocked(byProject, id) && !a.budget.take(watch{byProject, id}):
			a.rejected = append(a.rejected, a.budget.refuse(Rejection{ProjectID: id}))
		default:
			a.room--
			if c.projects.len() == 0 && !c.userScope {
				h.idx.addScoped(c.TenantID, 1)
			}
			c.projects.add(id)
			h.idx.add(byProject, key{c.TenantID, id}, c)
			a.projects = append(a.projects, id)
		}
	}
}

// admitUserLocked watches every task of the connection's user, unless it
// does already, has no user, or the budget refuses the listing.
func (c *Conn) admitUserLocked(a *admission) {
	h := c.hub
	if c.userScope || c.UserID == "" {
		return
	}
	if !c.listIsFreeLocked(byUser, c.UserID) && !a.budget.take(watch{by: byUser}) {
		a.rejected = append(a.rejected, a.budget.refuse(Rejection{}))
		return
	}
	if c.projects.len() == 0 {
		h.idx.addScoped(c.TenantID, 1)
	}
	c.userScope = true
	h.idx.add(byUser, key{c.TenantID, c.UserID}, c)
	a.user = true
}

// acceptSinceLocked records the versions the client says it holds.
func (c *Conn) acceptSinceLocked(since map[string]int64) {
	// What the client says it holds only spares it resends; entries beyond
	// what it could hold (every task it watches by id and a full listing
	// of its projects and user) would only grow this map, request after
	// request, so they are ignored.
	for id, v := range since {
		if c.track.get(id) == nil && c.track.len() >= c.hub.maxTracked() && !c.tasks.has(id) {
			continue
		}
		if snapshot.ValidID(id) {
			c.holdsLocked(id, v)
		}
	}
}

// holdsLocked records that the client holds version v of task id, unless
// the connection has a newer one on record. A pending snapshot not newer
// than v is dropped when it is taken.
func (c *Conn) holdsLocked(id string, v int64) {
	if t := c.track.get(id); t == nil || v > t.delivered {
		c.rememberLocked(id, v)
	}
}

// joinBus takes the connection's reference on its tenant's bus
// subscription. It fails only when ctx ended: with the bus down, the
// connection is polled instead.
func (c *Conn) joinBus(ctx context.Context) error {
	h := c.hub
	release, err := h.cfg.Bus.Subscribe(ctx, c.TenantID)
	switch {
	case err == nil:
		if !c.setBus(release) {
			release()
		}
	case ctx.Err() != nil:
		return ctx.Err()
	default:
		// The bus is down: the snapshots below are still current, and
		// the poll loop keeps them fresh and retries the subscription.
		h.log.Warn("bus subscribe failed; polling this connection", "conn", c.ID, "tenant", c.TenantID, "err", err)
		h.needBus(c)
	}
	return nil
}

// replayResume offers, in place of the initial state of what a added, the
// tasks changed after s.Resume, when the hub's Stream can replay them. It
// reports whether it did; otherwise everything is read, as for a new
// client. It fails only when ctx ended.
func (c *Conn) replayResume(ctx context.Context, s Subscription, a *admission) (replayed bool, err error) {
	h := c.hub
	if h.cfg.Stream == nil {
		return false, nil
	}
	if s.ResumeMismatch {
		h.stats.resumeFallbacks.Add(1)
		h.stats.resumeMismatches.Add(1)
		h.log.Debug("resume cursor of another subscription; reading everything", "conn", c.ID, "tenant", c.TenantID)
	}
	if s.Resume == "" {
		return false, nil
	}
	after, before, fallback := h.cfg.Stream.Replay(ctx, c.TenantID, s.Resume, h.resumeMargin())
	switch {
	case fallback != "":
		h.stats.resumeFallbacks.Add(1)
		h.log.Debug("resume cursor not replayable; reading everything", "conn", c.ID, "tenant", c.TenantID, "reason", fallback)
	case c.replay(ctx, after, before, a.tasks, a.projects, a.user) == nil:
		h.stats.resumes.Add(1)
		if p, err := cursor.Decode(s.Resume); err == nil {
			c.mu.Lock()
			c.resumedAt = uint32(p.ID.MS / 1000)
			c.mu.Unlock()
		}
		return true, nil
	case ctx.Err() != nil:
		return false, ctx.Err()
	default:
		h.stats.resumeFallbacks.Add(1) // reads failed: read everything below, each read reporting its own failure
	}
	return false, nil
}

// readInitial offers the current snapshot of each task a added and the
// listings of its projects and user, and rejects, as unavailable or not
// found, what it could not offer. It fails only when ctx ended.
func (c *Conn) readInitial(ctx context.Context, a *admission) error {
	h := c.hub
	for i, id := range a.tasks {
		snap, err := h.cfg.Source.Get(ctx, id, 0)
		switch {
		case err == nil && c.sees(snap): // another tenant's, or one the grant does not allow, is as absent
			h.initialFails.OK("initial reads succeed again")
			h.noteRead(snap, ReadSubscribe)
			c.offer(snap, news{})
		case err == nil, errors.Is(err, snapshot.ErrNotFound):
			a.rejected = append(a.rejected, Rejection{TaskID: id, Code: CodeNotFound})
		case errors.Is(err, snapshot.ErrInvalidID):
			a.rejected = append(a.rejected, Rejection{TaskID: id, Code: CodeInvalidID})
		default:
			if ctx.Err() != nil {
				return outOfTime(ctx, a, a.tasks[i:], a.projects, a.user)
			}
			h.initialFails.Fail("initial snapshot read failed", err, "conn", c.ID, "tenant", c.TenantID, "task", id)
			a.rejected = append(a.rejected, Rejection{TaskID: id, Code: CodeUnavailable})
		}
	}
	for i, id := range a.projects {
		if err := c.offerList(h.cfg.Source.ListProject(ctx, c.TenantID, id)); err != nil {
			if ctx.Err() != nil {
				return outOfTime(ctx, a, nil, a.projects[i:], a.user)
			}
			h.initialFails.Fail("project listing failed", err, "conn", c.ID, "tenant", c.TenantID, "project", id)
			a.rejected = append(a.rejected, Rejection{ProjectID: id, Code: CodeUnavailable})
		}
	}
	if a.user {
		if err := c.offerList(h.cfg.Source.ListUser(ctx, c.TenantID, c.UserID)); err != nil {
			if ctx.Err() != nil {
				return outOfTime(ctx, a, nil, nil, true)
			}
			h.initialFails.Fail("user listing failed", err, "conn", c.ID, "tenant", c.TenantID, "user", c.UserID)
			a.rejected = append(a.rejected, Rejection{Code: CodeUnavailable})
		}
	}
	return nil
}

// outOfTime ends initial reads that ctx cut short. When its deadline
// passed (the transport's subscribe timeout), what was not read is
// rejected unavailable, which the poll loop reads again, and the
// subscription stands (docs/PROTOCOL.md, the limit of the initial reads);
// when it was cancelled, the connection is ending, and its error stands.
func outOfTime(ctx context.Context, a *admission, tasks, projects []string, user bool) error {
	if !errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return ctx.Err()
	}
	for _, id := range tasks {
		a.rejected = append(a.rejected, Rejection{TaskID: id, Code: CodeUnavailable})
	}
	for _, id := range projects {
		a.rejected = append(a.rejected, Rejection{ProjectID: id, Code: CodeUnavailable})
	}
	if user {
		a.rejected = append(a.rejected, Rejection{Code: CodeUnavailable})
	}
	return nil
}

// unreadable reports whether r is a read that failed: the poll loop reads
// it again.
func unreadable(r Rejection) bool { return r.Code == CodeUnavailable }

// unwatched reports whether r leaves its id unwatched: the client must ask
// for it again.
func unwatched(r Rejection) bool {
	return r.Code == CodeRateLimitExceeded || r.Code == CodeTooMany || r.Code == CodeInvalidID
}

// readIsFreeLocked reports whether subscribing to the task costs no remote
// read: the source has a copy the connection sees. Only such a copy: the
// budget's answer must not tell a task hidden from the connection (another
// tenant's, or of a project not granted) from an absent one, so whether
// anyone else watches or read the id, or a copy of it that the connection
// does not see, changes nothing. c.mu guards the grant.
func (c *Conn) readIsFreeLocked(id string) bool {
	snap := c.hub.cfg.Source.Cached(id)
	return snap != nil && c.Sees(snap)
}

// listIsFreeLocked is readIsFreeLocked of a project (by byProject) or the
// user's listing: a connection of the tenant here watches it, or the
// source has it cached. A project not granted is never free, so that
// others' watching it tells nothing (its listing shows nothing anyway).
func (c *Conn) listIsFreeLocked(by int, id string) bool {
	h := c.hub
	if by == byProject && !c.Grant.Project(id) {
		return false
	}
	if h.idx.has(by, key{c.TenantID, id}) {
		return true
	}
	if by == byProject {
		return h.cfg.Source.ListCached(c.TenantID, id, "")
	}
	return h.cfg.Source.ListCached(c.TenantID, "", id)
}

// readBudget takes a subscription's reads from its user's budget, one id
// at a time, so the ids within it are served in order.
type readBudget struct {
	h     *Hub
	k     key
	now   time.Time
	wait  time.Duration
	spent bool // the budget ran out: the request's later ids are refused without asking
}

// take reports whether w may be read: one of the user's connections that
// closed lately watched it or paid for it lately, or the budget has a read
// for it.
func (b *readBudget) take(w watch) bool {
	if b.h.budgets.rewatched(b.k, w, b.now) {
		return true
	}
	if !b.spent {
		ok, wait := b.h.budgets.take(b.k, b.now)
		if ok {
			b.h.budgets.paid(b.k, w, b.now)
			return true
		}
		b.spent, b.wait = true, wait
	}
	b.h.stats.readsLimited.Add(1)
	return false
}

// refuse makes r a refusal for the spent budget, with when to ask again.
func (b *readBudget) refuse(r Rejection) Rejection {
	r.Code = CodeRateLimitExceeded
	r.RetryAfterMS = httperr.RetryAfterMS(b.wait)
	r.RetryAfter = httperr.RetryAfterSeconds(r.RetryAfterMS)
	return r
}

// settle marks the connection's initial state offered: from now on the
// tenant's stream position covers everything it watches, so its writes may
// carry the position, and a KindSync tells the client the one it has now.
// An initial state that lacks a task it could not read (not complete) is
// as of no position: the connection then writes the transport's own
// cursors, as one refused part of its subscription does, so that the
// client reconnecting with one is read that task again, not resumed past
// it.
func (c *Conn) settle(complete bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !complete {
		c.cursors = false
	}
	if c.closed || c.ending || !c.cursors {
		return
	}
	c.settled, c.syncPending = true, true
	c.syncWaiting.Store(false)
	c.scheduleLocked()
}

// offerList offers a listing as a subscription's initial state.
func (c *Conn) offerList(snaps []*snapshot.Snapshot, err error) error {
	return c.offerAll(news{}, ReadSubscribe, snaps, err)
}

// refreshList offers a listing re-read while polling: changes, live.
func (c *Conn) refreshList(snaps []*snapshot.Snapshot, err error) error {
	return c.offerAll(news{live: true, reread: true}, ReadPoll, snaps, err)
}

func (c *Conn) offerAll(n news, source ReadSource, snaps []*snapshot.Snapshot, err error) error {
	if err != nil {
		return err
	}
	for _, s := range snaps {
		c.hub.noteRead(s, source)
		c.offer(s, n)
	}
	return nil
}

// setBus hands the connection its bus reference; false means it has one
// already or is closed, and the caller releases release.
func (c *Conn) setBus(release func()) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed || c.busRelease != nil {
		return false
	}
	c.busRelease = release
	return true
}

// refreshScopes re-reads the connection's project and user listings and
// reports whether every read succeeded.
func (c *Conn) refreshScopes() bool {
	h := c.hub
	c.mu.Lock()
	projects := c.projects.ids()
	user := c.userScope
	c.mu.Unlock()
	ctx, cancel := context.WithTimeout(h.ctx, h.cfg.FetchTimeout)
	defer cancel()
	ok := true
	for _, id := range projects {
		if c.refreshList(h.cfg.Source.ListProject(ctx, c.TenantID, id)) != nil {
			ok = false
		}
	}
	if user && c.refreshList(h.cfg.Source.ListUser(ctx, c.TenantID, c.UserID)) != nil {
		ok = false
	}
	return ok
}

// Unsubscribe stops watching tasks and projects. Pending snapshots of tasks
// no longer watched are dropped.
func (c *Conn) Unsubscribe(tasks, projects []string) {
	h := c.hub
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return
	}
	for _, id := range tasks {
		if c.tasks.remove(id) {
			h.idx.remove(byTask, key{c.TenantID, id}, c)
		}
	}
	hadScope := c.projects.len() > 0 || c.userScope
	for _, id := range projects {
		if c.projects.remove(id) {
			h.idx.remove(byProject, key{c.TenantID, id}, c)
		}
	}
	if hadScope && c.projects.len() == 0 && !c.userScope {
		h.idx.addScoped(c.TenantID, -1)
	}
	kept := c.order[:0]
	for _, t := range c.order {
		if c.watchesLocked(t.snap) {
			kept = append(kept, t)
			continue
		}
		t.snap = nil
		t.setNews(news{})
		if t.delivered == 0 {
			c.forgetLocked(t.id)
		}
	}
	clear(c.order[len(kept):])
	c.order = kept
}
