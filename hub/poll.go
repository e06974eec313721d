package hub

import (
	"context"
	"maps"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/pushd/pushd/snapshot"
)

// Reasons given with a mode change.
const (
	ReasonPubSubDown   = "pubsub_down"         // the bus lost its subscription; polling until it is back
	ReasonUnavailable  = "sources_unavailable" // neither Redis nor PostgreSQL answers; clients keep their last state
	ReasonRestored     = "restored"            // the bus is back and everything was re-read once
	reloadBatch        = snapshot.MaxMany
	busRetryTimeout    = 2 * time.Second
	refreshRoundBudget = 30 * time.Second
)

// poller is the state shared between the bus's callbacks, connections and
// the poll loop. The loop is the only goroutine that reads sources for it;
// everyone else records what is needed and wakes it, so the bus's reading
// loop never waits.
type poller struct {
	wake chan struct{} // cap 1

	mu       sync.Mutex // guards the fields below
	polling  bool       // the bus cannot be trusted: re-read on a timer
	restored bool       // the bus came back: re-read everything once, then push
	tenants  map[string]struct{}
	needBus  map[*Conn]struct{} // connections whose bus subscription failed
	// lost holds the tenants whose shard of the bus is lost (TenantsLost),
	// polled until it is back; back those whose shard came back
	// (TenantsRestored), re-read once, then told push.
	lost map[string]struct{}
	back map[string]struct{}
	// unread holds tenants with a connection whose initial read failed,
	// re-read with backoff, from the caches, until a round succeeds; not
	// before unreadAt, so a storm that overloaded the sources is not
	// answered with more reads at once.
	unread   map[string]struct{}
	unreadAt time.Time
}

func (p *poller) init() {
	p.wake = make(chan struct{}, 1)
	p.tenants = make(map[string]struct{})
	p.needBus = make(map[*Conn]struct{})
	p.unread = make(map[string]struct{})
	p.lost = make(map[string]struct{})
	p.back = make(map[string]struct{})
}

func (p *poller) signal() {
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

func (p *poller) resync(tenant string) {
	p.mu.Lock()
	p.tenants[tenant] = struct{}{}
	p.mu.Unlock()
	p.signal()
}

func (p *poller) retry(tenant string, after time.Duration) {
	p.mu.Lock()
	p.unread[tenant] = struct{}{}
	if p.unreadAt.IsZero() {
		p.unreadAt = time.Now().Add(after)
	}
	p.mu.Unlock()
	p.signal() // to arm the timer
}

// Lost switches the node to polling: the bus's subscription cannot be
// trusted, so watched tasks are re-read on a timer until it is restored.
func (h *Hub) Lost(err error) {
	h.log.Warn("bus lost; polling", "err", err)
	h.poll.mu.Lock()
	h.poll.polling, h.poll.restored = true, false
	h.poll.mu.Unlock()
	h.poll.signal()
}

// Restored switches the node back to push once everything watched was
// re-read; the bus's per-tenant Resyncs cover what changed since.
func (h *Hub) Restored() {
	h.log.Info("bus restored; resyncing")
	h.poll.mu.Lock()
	h.poll.polling, h.poll.restored = false, true
	h.poll.mu.Unlock()
	h.poll.signal()
}

// TenantsLost switches these tenants to polling: their shard of the bus
// cannot be trusted, so the tasks their connections watch are re-read on a
// timer, and those connections are told polling, until TenantsRestored.
// The other tenants stay in push mode.
func (h *Hub) TenantsLost(tenants []string, err error) {
	h.log.Warn("bus lost for some tenants; polling them", "tenants", len(tenants), "err", err)
	h.poll.mu.Lock()
	for _, t := range tenants {
		h.poll.lost[t] = struct{}{}
		delete(h.poll.back, t)
	}
	h.poll.mu.Unlock()
	h.poll.signal()
}

// TenantsRestored switches these tenants back to push once what they watch
// was re-read; the bus's Resync of each covers what changed since.
func (h *Hub) TenantsRestored(tenants []string) {
	h.log.Debug("bus restored for some tenants", "tenants", len(tenants))
	h.poll.mu.Lock()
	for _, t := range tenants {
		if _, ok := h.poll.lost[t]; ok {
			delete(h.poll.lost, t)
			h.poll.back[t] = struct{}{}
		}
	}
	h.poll.mu.Unlock()
	h.poll.signal()
}

// needBus records a connection whose bus subscription failed; the poll loop
// retries it, and polls its tasks meanwhile.
func (h *Hub) needBus(c *Conn) {
	h.poll.mu.Lock()
	h.poll.needBus[c] = struct{}{}
	h.poll.mu.Unlock()
	h.poll.signal()
}

func (h *Hub) forgetConn(c *Conn) {
	h.poll.mu.Lock()
	delete(h.poll.needBus, c)
	h.poll.mu.Unlock()
}

// pollLoop re-reads watched tasks: all of them on every tick while polling,
// everything once after the bus is restored, a tenant's after its Resync;
// those of the tenants whose shard is lost on every tick, and once when it
// is back.
func (h *Hub) pollLoop() {
	defer h.wg.Done()
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	defer timer.Stop()
	var failures, readFailures int
	for {
		select {
		case <-h.ctx.Done():
			return
		case <-h.poll.wake:
		case <-timer.C:
		}
		r := h.poll.take()
		// A tenant back from a lost shard is re-read once (below, with the
		// resyncs), unless the stream carried what the shard dropped.
		for t := range r.back {
			if !h.streamCovers(t) {
				r.tenants[t] = struct{}{}
			}
		}
		for t := range r.tenants {
			delete(r.unread, t) // re-read below anyway
		}
		if r.waiting {
			// Connections the bus still refuses are polled meanwhile.
			for _, t := range h.retryBus() {
				r.tenants[t] = struct{}{}
			}
		}
		failures = h.pollRound(r, failures)
		h.setTenantsMode(r.back, ModePush, ReasonRestored, false)
		if len(r.lost) > 0 {
			failures = h.pollLost(r.lost, r.polling || r.restored, failures)
		}
		readFailures = h.retryUnread(r.unread, readFailures)

		p := &h.poll
		p.mu.Lock()
		again := p.polling || len(p.needBus) > 0 || len(p.lost) > 0
		retryAt := p.unreadAt
		p.mu.Unlock()
		switch {
		case again:
			timer.Reset(h.pollWait(max(failures, readFailures)))
		case !retryAt.IsZero():
			timer.Reset(time.Until(retryAt))
		}
	}
}

// pollWork is what one round of the poll loop does, taken from the poller
// at once, under its lock.
type pollWork struct {
	polling, restored bool                // the whole bus is lost, or came back
	waiting           bool                // connections whose bus subscription failed
	tenants           map[string]struct{} // resynced tenants, re-read once
	unread            map[string]struct{} // tenants whose initial read failed, due now
	lost, back        map[string]struct{} // tenants whose shard is lost, or came back
}

func (p *poller) take() pollWork {
	p.mu.Lock()
	defer p.mu.Unlock()
	w := pollWork{polling: p.polling, restored: p.restored, waiting: len(p.needBus) > 0, tenants: p.tenants, back: p.back}
	p.restored = false
	p.tenants, p.back = make(map[string]struct{}), make(map[string]struct{})
	if len(p.unread) > 0 && !time.Now().Before(p.unreadAt) {
		w.unread = p.unread
		p.unread, p.unreadAt = make(map[string]struct{}), time.Time{}
	}
	if len(p.lost) > 0 {
		w.lost = maps.Clone(p.lost)
	}
	return w
}

// pollRound does the node-wide part of a round: every watched task while
// the whole bus is lost, everything once when it came back, the resynced
// tenants otherwise. It returns the failure count the backoff doubles by.
func (h *Hub) pollRound(r pollWork, failures int) int {
	// With a stream that delivers every change of every watched tenant,
	// a lost or restored bus costs no re-read: the stream carries what
	// the bus drops. Checked on every round, so polling starts once the
	// stream fails too.
	covered := h.cfg.Stream != nil && (r.polling || r.restored) && h.cfg.Stream.CoversAll()
	switch {
	case covered:
		h.stats.catchUps.Add(1)
		if !h.isPush() {
			h.setMode(ModePush, ReasonRestored)
		}
		if len(r.tenants) > 0 {
			h.refresh(r.tenants, false) // connections the bus still refuses
		}
		return 0
	case r.polling:
		if h.isPush() { // tell clients before a round that may be slow
			h.setMode(ModePolling, ReasonPubSubDown)
		}
		h.stats.polls.Add(1)
		if h.refresh(nil, false) {
			h.setMode(ModePolling, ReasonPubSubDown)
			return 0
		}
		h.stats.pollErrors.Add(1)
		h.setMode(ModePolling, ReasonUnavailable)
		return failures + 1
	case r.restored:
		h.refresh(nil, false)
		h.setMode(ModePush, ReasonRestored)
		return 0
	case len(r.tenants) > 0:
		h.refresh(r.tenants, false)
	}
	return failures
}

// pollLost re-reads what the tenants whose shard is lost watch, except
// those the stream covers, and tells their connections polling with why
// (before the round, which may be slow, and after it, when no source
// answered). read says this round re-read everything already. It returns
// the failure count the backoff doubles by.
func (h *Hub) pollLost(lost map[string]struct{}, read bool, failures int) int {
	covered := make(map[string]struct{})
	for t := range lost {
		if h.streamCovers(t) {
			covered[t] = struct{}{}
			delete(lost, t)
		}
	}
	if len(covered) > 0 {
		h.stats.catchUps.Add(1)
		h.setTenantsMode(covered, ModePush, ReasonRestored, false)
	}
	if len(lost) == 0 {
		return failures
	}
	h.setTenantsMode(lost, ModePolling, ReasonPubSubDown, true)
	if read {
		return failures
	}
	h.stats.polls.Add(1)
	if h.refresh(lost, false) {
		h.setTenantsMode(lost, ModePolling, ReasonPubSubDown, false)
		return 0
	}
	h.stats.pollErrors.Add(1)
	h.setTenantsMode(lost, ModePolling, ReasonUnavailable, false)
	return failures + 1
}

// streamCovers reports whether the Stream brings every change of tenant.
func (h *Hub) streamCovers(tenant string) bool {
	return h.cfg.Stream != nil && h.cfg.Stream.Covers(tenant)
}

// retryUnread re-reads the tenants whose initial reads failed, from the
// caches (what other connections' reads brought in meanwhile serves them
// too), puts them back after the backoff if that failed, and returns the
// failure count the backoff doubles by.
func (h *Hub) retryUnread(unread map[string]struct{}, failures int) int {
	if len(unread) == 0 {
		return failures
	}
	h.stats.readRetries.Add(1)
	if h.refresh(unread, true) {
		return 0
	}
	failures++
	for t := range unread {
		h.poll.retry(t, h.pollWait(failures))
	}
	return failures
}

func (h *Hub) isPush() bool {
	mode, _ := h.Mode()
	return mode == ModePush
}

// pollWait is the jittered interval, doubled per round in which no source
// answered, up to MaxPollBackoff.
func (h *Hub) pollWait(failures int) time.Duration {
	d := h.cfg.PollInterval
	for range min(failures, 16) {
		d *= 2
		if d >= h.cfg.MaxPollBackoff {
			d = h.cfg.MaxPollBackoff
			break
		}
	}
	return d*4/5 + rand.N(d*2/5+1)
}

// refresh re-reads the tasks watched by the given tenants' connections (all
// tenants when nil), in batches, bypassing caches unless cached is set, and
// offers what it read: the outboxes drop what did not move. It reports
// whether every read succeeded.
func (h *Hub) refresh(tenants map[string]struct{}, cached bool) bool {
	ctx, cancel := context.WithTimeout(h.ctx, refreshRoundBudget)
	defer cancel()
	ids := h.idx.tasks(tenants)
	// The tenants' connections first, then each one's lock, with the hub's
	// let go: a connection's lock may be held by its Subscribe, waiting on
	// a read budget, and the hub's read lock held meanwhile would stop
	// every connect and close of the node behind it.
	var conns []*Conn
	h.mu.RLock()
	for c := range h.conns {
		if _, ok := tenants[c.TenantID]; tenants == nil || ok {
			conns = append(conns, c)
		}
	}
	h.mu.RUnlock()
	scoped := conns[:0]
	for _, c := range conns {
		c.mu.Lock()
		if c.projects.len() > 0 || c.userScope {
			scoped = append(scoped, c)
		}
		c.mu.Unlock()
	}
	clear(conns[len(scoped):])

	ok := true
	var targets []*Conn
	for i := 0; i < len(ids); i += reloadBatch {
		batch := ids[i:min(i+reloadBatch, len(ids))]
		read := h.cfg.Source.Reload
		if cached {
			read = h.cfg.Source.GetMany
		}
		snaps, err := read(ctx, batch)
		if err != nil {
			ok = false
			h.log.Debug("reload failed", "tasks", len(batch), "err", err)
			if ctx.Err() != nil {
				return false
			}
			continue
		}
		// A cached round retries initial reads that failed: what it
		// delivers is a subscription's initial state, not measured for
		// staleness. An uncached round looks for changes.
		n := news{live: !cached, reread: true}
		for _, s := range snaps {
			h.noteRead(s, ReadPoll)
			targets = h.offerToWatchers(s, n, targets[:0])
		}
	}
	for _, c := range scoped {
		if !c.refreshScopes() {
			ok = false
		}
	}
	return ok
}

// retryBus subscribes the connections whose bus subscription failed, and
// re-reads their tenants' tasks once subscribed: changes published before
// the subscription was confirmed were not heard. It returns the tenants of
// the connections still without one.
func (h *Hub) retryBus() (failed []string) {
	h.poll.mu.Lock()
	conns := make([]*Conn, 0, len(h.poll.needBus))
	for c := range h.poll.needBus {
		conns = append(conns, c)
	}
	h.poll.mu.Unlock()
	for _, c := range conns {
		h.stats.busRetries.Add(1)
		ctx, cancel := context.WithTimeout(h.ctx, busRetryTimeout)
		release, err := h.cfg.Bus.Subscribe(ctx, c.TenantID)
		cancel()
		if err != nil {
			failed = append(failed, c.TenantID)
			continue
		}
		h.forgetConn(c)
		if !c.setBus(release) {
			release()
			continue
		}
		h.poll.resync(c.TenantID)
	}
	return failed
}
