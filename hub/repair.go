package hub

import (
	"slices"
	"time"

	"github.com/pushd/pushd/snapshot"
)

// Checked is what a repair round's check found, for OfferChecked.
type Checked struct {
	// Found are the snapshots Redis holds.
	Found []*snapshot.Snapshot
	// Repaired are the database's versions of tasks where it held a newer
	// one than Redis, never announced: the check published them, so
	// every node hears of them; OfferChecked counts and logs them.
	Repaired []*snapshot.Snapshot
}

const (
	// DefaultRepairInterval is Config.RepairInterval's default: a change
	// never announced shows within 11 s, and 10,000 watched tasks cost
	// the fleet 1,000 rows of versions a second.
	DefaultRepairInterval = 10 * time.Second
	// repairGrace is how old a change must be before a round that delivers
	// it counts it as repaired: a hint takes milliseconds, so one younger
	// may still be on its way.
	repairGrace = time.Second
)

// resumeMargin is how much earlier than a resume cursor's entry a change
// must have been written for a repair round to take it as one the resumed
// client has: a change the stream lacks that was written before the cursor
// reached the client's previous connection, whose own rounds delivered it
// unless it went away within an interval of the change. A second more
// covers the Task State Service's clock running ahead of Redis's.
func (h *Hub) resumeMargin() time.Duration { return h.cfg.RepairInterval + time.Second }

// OfferChecked offers what a repair round's check found to its watchers,
// the outboxes dropping what is not newer, and counts and logs as
// repaired what a connection lacked (Stats's RepairOlder, RepairUnheld and
// RepairAge). The rounds are package converge's, which reads what they
// check here (RepairIDs, RepairScopes); whom a snapshot goes to, and what
// counts as a repair, is delivery, the hub's. What a failed check found is
// offered too: Redis may have answered when PostgreSQL did not.
func (h *Hub) OfferChecked(found Checked) {
	var targets []*Conn
	now := time.Now()
	for _, s := range found.Repaired {
		// Never in Redis before: no client took it for one it holds.
		targets, _ = h.offerRepair(s, news{live: true}, targets[:0])
		h.stats.repairAge.Observe(now.Sub(time.UnixMilli(s.UpdatedAt)))
	}
	for _, s := range found.Found {
		targets = h.countRepair(s, now, targets[:0])
	}
}

// RepairIDs is every task the repair rounds check, once each and sorted,
// so that nodes watching the same tasks claim them in the same batches:
// those a local connection watches by id, and those its project and user
// subscriptions hold.
func (h *Hub) RepairIDs() []string {
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

// RepairScopes is every project and user scope a local connection
// watches, once each, with since when (Scope.WatchedSince): a task created
// in one and never announced is in no subscription RepairIDs reads.
func (h *Hub) RepairScopes() []snapshot.Scope { return h.idx.scopes() }

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
