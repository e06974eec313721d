package hub

import (
	"cmp"
	"context"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/pushd/pushd/snapshot"
)

// Checker is what the repair rounds read watched tasks through: a change
// written and never announced (a lost hint, a writer that died between its
// steps, a failover that lost writes) is found there, the database version
// winning. node fills it in with a converge.Repairer, over the snapshot
// store and the node's publisher; nil means no repair (the embedded mode,
// where nothing is lost).
type Checker interface {
	// Check returns the newest snapshot found of each task of ids (at most
	// RepairBatch). finished asks for the tasks last found finished too,
	// which a Checker may otherwise leave to a later round.
	Check(ctx context.Context, ids []string, finished bool) (Checked, error)
	// CheckScopes lists what changed lately in each scope of scopes (at
	// most RepairBatch), so that a task a scope's subscriptions never held
	// is found too: Found are the changes Redis holds, which the Checker
	// announced again, Repaired those it published.
	CheckScopes(ctx context.Context, scopes []snapshot.Scope) (Checked, error)
}

// Checked is what a Check found.
type Checked struct {
	// Found are the snapshots Redis holds.
	Found []*snapshot.Snapshot
	// Repaired are the database's versions of tasks where it held a newer
	// one than Redis, never announced: the Checker published them, so
	// every node hears of them; it counts and logs them.
	Repaired []*snapshot.Snapshot
}

const (
	// DefaultRepairInterval is Config.RepairInterval's default: a change
	// never announced shows within 11 s, and 10,000 watched tasks cost
	// the fleet 1,000 rows of versions a second.
	DefaultRepairInterval = 10 * time.Second
	// RepairBatch bounds the ids of one Check.
	RepairBatch = 1000
	// RepairFinishedEvery is how many repair rounds make one that checks
	// finished tasks too: they change again only when the platform retries
	// them, and a dashboard of finished tasks would otherwise be most of
	// what a round reads.
	RepairFinishedEvery = 10
	// repairGrace is how old a change must be before a round that delivers
	// it counts it as repaired: a hint takes milliseconds, so one younger
	// may still be on its way.
	repairGrace = time.Second
	// repairSpread bounds the random delay of a node's round after its slot
	// begins, at most an eighth of the interval: the nodes' claims come one
	// after another, each node's in one piece.
	repairSpread = 250 * time.Millisecond
	// repairMaxBackoff is the most rounds skipped after failed ones.
	repairMaxBackoff = 3
	// repairRoundBudget bounds one round.
	repairRoundBudget = 30 * time.Second
)

// resumeMargin is how much earlier than a resume cursor's entry a change
// must have been written for a repair round to take it as one the resumed
// client has: a change the stream lacks that was written before the cursor
// reached the client's previous connection, whose own rounds delivered it
// unless it went away within an interval of the change. A second more
// covers the Task State Service's clock running ahead of Redis's.
func (h *Hub) resumeMargin() time.Duration { return h.cfg.RepairInterval + time.Second }

// repairLoop runs a repair round at the start of every RepairInterval of
// the wall clock (plus a small random delay), the same slots on every node,
// so that the first node of a slot claims the fleet's checks of the tasks it
// watches in one piece. A round that failed doubles the wait, up to 8
// intervals; while the node polls, the poll rounds read everything anyway.
func (h *Hub) repairLoop() {
	defer h.wg.Done()
	interval := h.cfg.RepairInterval
	spread := min(interval/8, repairSpread)
	failures := 0
	for {
		now := time.Now()
		slot := nextRepairSlot(now, interval, failures)
		t := time.NewTimer(slot.Sub(now) + rand.N(spread+1))
		select {
		case <-h.ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		if !h.isPush() {
			continue
		}
		// The slot's number, the same on every node: the rounds that check
		// finished tasks too are the same.
		n := slot.UnixNano() / int64(interval)
		h.stats.repairStarted.Add(1)
		ok := h.repairRound(n%RepairFinishedEvery == 0)
		h.stats.repairSlot.Store(slot.UnixMilli())
		h.stats.repairRounds.Add(1) // last, so a count read means a round and its slot are done
		if ok {
			failures = 0
		} else {
			failures++
		}
	}
}

// nextRepairSlot is when the round after now starts: the next multiple of
// interval on the wall clock, or after failures failed rounds in a row
// that many intervals doubled further, up to 8.
func nextRepairSlot(now time.Time, interval time.Duration, failures int) time.Time {
	return now.Truncate(interval).Add(interval << min(failures, repairMaxBackoff))
}

// repairRound checks every task a local connection watches, by id or as a
// task of its project or user scope that it holds, then lists the changes
// of every watched scope (a task its subscriptions never held), and offers
// what it found: the outboxes drop what is not newer. It reports whether
// every check succeeded.
func (h *Hub) repairRound(finished bool) bool {
	ctx, cancel := context.WithTimeout(h.ctx, repairRoundBudget)
	defer cancel()
	// Every batch is checked even after one failed: a check that found
	// PostgreSQL busy or slow skipped or ended its own part, and the next
	// round comes later for it; the batches after it lose nothing by trying.
	ok := true
	failed := func(what string, n int, err error) {
		if ok {
			h.stats.repairErrors.Add(1)
		}
		ok = false
		h.log.Debug("repair check failed", what, n, "err", err)
	}
	ids := h.repairIDs()
	var targets []*Conn
	for i := 0; i < len(ids) && ctx.Err() == nil; i += RepairBatch {
		found, err := h.cfg.Checker.Check(ctx, ids[i:min(i+RepairBatch, len(ids))], finished)
		if targets = h.offerChecked(found, targets); err != nil {
			failed("tasks", len(ids), err)
		}
	}
	scopes := h.idx.scopes()
	// A scope first listed reaches back to when it began to be watched:
	// rounds may come 8 intervals apart. Further back there is nothing a
	// round could have missed, only markers Redis lost.
	oldest := time.Now().Add(-(h.cfg.RepairInterval<<repairMaxBackoff + h.cfg.RepairInterval)).UnixMilli()
	for i := range scopes {
		scopes[i].WatchedSince = max(scopes[i].WatchedSince, oldest)
	}
	slices.SortFunc(scopes, func(a, b snapshot.Scope) int {
		return cmp.Or(cmp.Compare(a.TenantID, b.TenantID), cmp.Compare(a.ProjectID, b.ProjectID), cmp.Compare(a.UserID, b.UserID))
	})
	for i := 0; i < len(scopes) && ctx.Err() == nil; i += RepairBatch {
		found, err := h.cfg.Checker.CheckScopes(ctx, scopes[i:min(i+RepairBatch, len(scopes))])
		if targets = h.offerChecked(found, targets); err != nil {
			failed("scopes", len(scopes), err)
		}
	}
	return ok
}

// offerChecked offers what a check found to its watchers. What a failed
// check found is offered still: Redis may have answered when PostgreSQL
// did not.
func (h *Hub) offerChecked(found Checked, targets []*Conn) []*Conn {
	now := time.Now()
	for _, s := range found.Repaired {
		// Never in Redis before: no client took it for one it holds.
		targets, _ = h.offerRepair(s, news{live: true}, targets[:0])
		h.stats.repairAge.Observe(now.Sub(time.UnixMilli(s.UpdatedAt)))
	}
	for _, s := range found.Found {
		targets = h.countRepair(s, now, targets[:0])
	}
	return targets
}

// repairIDs is every task the repair checks, once each and sorted, so
// that nodes watching the same tasks claim them in the same batches.
func (h *Hub) repairIDs() []string {
	ids := h.idx.tasks(nil)
	seen := make(map[string]struct{}, len(ids))
	for _, id := range ids {
		seen[id] = struct{}{}
	}
	for _, c := range h.allConns() {
		c.mu.Lock()
		if c.projects.len() > 0 || c.userScope {
			c.track.each(func(t *tracked) {
				if _, ok := seen[t.id]; !ok {
					seen[t.id] = struct{}{}
					ids = append(ids, t.id)
				}
			})
		}
		c.mu.Unlock()
	}
	slices.Sort(ids)
	return ids
}

// countRepair offers a snapshot Redis holds to its watchers and counts it
// as repaired when a connection took it that held an older version or
// none, unless it is young enough that its hint may be on its way still.
func (h *Hub) countRepair(s *snapshot.Snapshot, now time.Time, targets []*Conn) []*Conn {
	targets, held := h.offerRepair(s, news{live: true, reread: true}, targets)
	age := now.Sub(time.UnixMilli(s.UpdatedAt))
	if held == heldNewer || age < repairGrace {
		return targets
	}
	if held == heldOlder {
		h.stats.repairOlder.Add(1)
	} else {
		h.stats.repairUnheld.Add(1)
	}
	h.stats.repairAge.Observe(age)
	h.log.Info("repaired a stale task", "tenant", s.TenantID, "task", s.TaskID, "version", s.Version,
		"held_older", held == heldOlder, "age", age.Round(time.Millisecond))
	return targets
}

// What the connections that took a repair's snapshot held of its task.
const (
	heldNewer = iota // none took it: each held it or a newer version
	heldNone         // some took it, none held a version of the task
	heldOlder        // some took it that held an older version
)

// offerRepair offers s to its watchers, as offerToWatchers does, and says
// what those that took it held.
func (h *Hub) offerRepair(s *snapshot.Snapshot, n news, targets []*Conn) (_ []*Conn, held int) {
	h.noteRead(s, ReadRepair)
	targets = h.watchersOf(s, targets)
	ready := 0
	held = heldNewer
	for _, c := range targets {
		push, taken, had := c.offerTracked(s, n)
		switch {
		case !taken:
		case had > 0:
			held = heldOlder
		default:
			held = max(held, heldNone)
		}
		if push {
			targets[ready] = c
			ready++
		}
	}
	h.runq.pushAll(targets[:ready])
	clear(targets)
	return targets, held
}
