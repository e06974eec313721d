package converge

import (
	"cmp"
	"context"
	"errors"
	"log/slog"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pushd/pushd/fanout"
	"github.com/pushd/pushd/hub"
	"github.com/pushd/pushd/keys"
	"github.com/pushd/pushd/snapshot"
	"github.com/pushd/pushd/snapshot/store"
)

// RepairConfig configures a Repairer. Store, Redis, Publisher and
// Announcer are required.
type RepairConfig struct {
	// Store reads the snapshots Redis holds and, in its PostgreSQL slots,
	// the versions and rows PostgreSQL holds.
	Store *store.Store
	// Redis is the store's Redis (the cache role), where the repair
	// markers are claimed and written; Names must be the store's names.
	Redis redis.UniversalClient
	Names keys.Names
	// Publisher stores a change never announced unless a newer version is
	// there, and announces it: the node's publisher, as a Task State
	// Service's. It is called from several goroutines at once.
	Publisher fanout.Publisher
	// Announcer announces again a version Redis holds, whose writer may
	// never have announced it: the node's Redis publisher.
	Announcer *fanout.RedisPublisher
	// Logger receives the repairs and their failures. Nil means
	// slog.Default().
	Logger *slog.Logger
}

// The rounds' bounds, documented in
// docs/DESIGN.md, "Repair: changes never announced". The interval itself
// is the hub's (hub.Config.RepairInterval): a resume's margin depends on
// it too.
const (
	// repairBatch bounds the ids, or the scopes, of one check.
	repairBatch = store.MaxCheck
	// repairFinishedEvery is how many repair rounds make one that checks
	// finished tasks too: they change again only when the platform retries
	// them, and a dashboard of finished tasks would otherwise be most of
	// what a round reads.
	repairFinishedEvery = 10
	// repairSpread bounds the random delay of a node's round after its slot
	// begins, at most an eighth of the interval: the nodes' claims come one
	// after another, each node's in one piece.
	repairSpread = 250 * time.Millisecond
	// repairMaxBackoff is the most rounds skipped after failed ones.
	repairMaxBackoff = 3
	// repairRoundBudget bounds one round.
	repairRoundBudget = 30 * time.Second
)

// Repairer runs a node's repair rounds, on a Redis mode: every
// hub.Config.RepairInterval of the wall clock, the same slots on every
// node, it checks every task and scope the hub's connections watch, in
// batches, against Redis and, for what this node claims for the fleet,
// against PostgreSQL. What PostgreSQL holds newer is published with the
// node's publisher, what a scope's listing finds in Redis is announced
// again, as a Task State Service would have, and what was found is
// offered to the hub's watchers (hub.Hub.OfferChecked). docs/DESIGN.md,
// "Repair: changes never announced".
type Repairer struct {
	store     *store.Store
	rdb       redis.UniversalClient
	names     keys.Names
	publisher fanout.Publisher
	announcer *fanout.RedisPublisher
	log       *slog.Logger

	ctx    context.Context // ended by Close: the rounds' parent
	cancel context.CancelFunc
	wg     sync.WaitGroup // the loop

	// hold is how long a claim keeps the fleet's other nodes away: half an
	// interval, less than any node's next round. Set by Start, read by the
	// loop.
	hold time.Duration

	stats repairCounters
}

// RepairStats are a Repairer's counters since it was made.
type RepairStats struct {
	Rounds uint64 // repair rounds run to their end
	// Running says a repair round is under way; Slot is the start of the
	// slot whose round ended last (zero before the first): the rounds of
	// one slot on every node of a fleet find each task's check claimed
	// once, and a node whose slot lags has stopped repairing (polling, or
	// backing off from a busy PostgreSQL).
	Running bool
	Slot    time.Time
	Errors  uint64 // rounds a check failed in

	// Of the checks of watched tasks and the listings of watched scopes.
	Checked      uint64 // tasks this node claimed and checked against PostgreSQL
	CheckQueries uint64 // PostgreSQL queries of versions and listings those checks sent (the rows of the changes found newer are read as any other, in the store's DBQueries)
	CheckErrors  uint64 // of CheckQueries, those that failed
	CheckRows    uint64 // rows the checks read: versions, listed changes, and the rows of the changes found newer
	CheckSkipped uint64 // checks whose PostgreSQL part was skipped: the slots were busy, or it failed
	Repaired     uint64 // changes never announced found newer in PostgreSQL, and published
	ScopesListed uint64 // watched scopes this node claimed and listed the changes of
	Announced    uint64 // listed changes Redis held in PostgreSQL's version, announced again
}

// repairCounters are the live RepairStats.
type repairCounters struct {
	started, rounds, errors, slot                 atomic.Uint64 // slot: Unix ms
	checked, checkQueries, checkErrors, checkRows atomic.Uint64
	checkSkipped, repaired, scopesListed          atomic.Uint64
	announced                                     atomic.Uint64
}

// NewRepairer returns a node's repair rounds; Start runs them.
func NewRepairer(cfg RepairConfig) *Repairer {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &Repairer{
		store: cfg.Store, rdb: cfg.Redis, names: cfg.Names,
		publisher: cfg.Publisher, announcer: cfg.Announcer, log: cfg.Logger,
		ctx: ctx, cancel: cancel,
	}
}

// Start runs the rounds over what h's connections watch, every
// h.Config().RepairInterval, until Close. Call it once.
func (r *Repairer) Start(h *hub.Hub) {
	interval := h.Config().RepairInterval
	r.hold = interval / 2
	r.wg.Go(func() { r.loop(h, interval) })
}

// Close stops the rounds, ending the one running, and waits for it. It is
// idempotent.
func (r *Repairer) Close() {
	r.cancel()
	r.wg.Wait()
}

// Stats returns the counters so far. Each is read atomically, not all of
// them at one instant.
func (r *Repairer) Stats() RepairStats {
	c := &r.stats
	s := RepairStats{
		Rounds: c.rounds.Load(), Errors: c.errors.Load(),
		Checked: c.checked.Load(), CheckQueries: c.checkQueries.Load(), CheckErrors: c.checkErrors.Load(),
		CheckRows: c.checkRows.Load(), CheckSkipped: c.checkSkipped.Load(), Repaired: c.repaired.Load(),
		ScopesListed: c.scopesListed.Load(), Announced: c.announced.Load(),
	}
	if ms := c.slot.Load(); ms > 0 {
		s.Slot = time.UnixMilli(int64(ms))
	}
	// Read after Rounds: a round that ends between the two reads is still
	// said to run, never one that runs said to have ended.
	s.Running = c.started.Load() > s.Rounds
	return s
}

// loop runs a repair round at the start of every interval of the wall
// clock (plus a small random delay), the same slots on every node, so
// that the first node of a slot claims the fleet's checks of the tasks it
// watches in one piece. A round that failed doubles the wait, up to 8
// intervals; while the node polls, the poll rounds read everything anyway.
func (r *Repairer) loop(h *hub.Hub, interval time.Duration) {
	spread := min(interval/8, repairSpread)
	failures := 0
	for {
		now := time.Now()
		slot := nextRepairSlot(now, interval, failures)
		t := time.NewTimer(slot.Sub(now) + rand.N(spread+1))
		select {
		case <-r.ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		if mode, _ := h.Mode(); mode != hub.ModePush {
			continue
		}
		// The slot's number, the same on every node: the rounds that check
		// finished tasks too are the same.
		n := slot.UnixNano() / int64(interval)
		r.stats.started.Add(1)
		ok := r.round(h, interval, n%repairFinishedEvery == 0)
		r.stats.slot.Store(uint64(slot.UnixMilli()))
		r.stats.rounds.Add(1) // last, so a count read means a round and its slot are done
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

// round checks every task a local connection watches, by id or as a task
// of its project or user scope that it holds, then lists the changes of
// every watched scope (a task its subscriptions never held), and offers
// what it found to h: the outboxes drop what is not newer. It reports
// whether every check succeeded.
func (r *Repairer) round(h *hub.Hub, interval time.Duration, finished bool) bool {
	ctx, cancel := context.WithTimeout(r.ctx, repairRoundBudget)
	defer cancel()
	// Every batch is checked even after one failed: a check that found
	// PostgreSQL busy or slow skipped or ended its own part, and the next
	// round comes later for it; the batches after it lose nothing by trying.
	ok := true
	failed := func(what string, n int, err error) {
		if ok {
			r.stats.errors.Add(1)
		}
		ok = false
		r.log.Debug("repair check failed", what, n, "err", err)
	}
	ids := h.RepairIDs()
	for i := 0; i < len(ids) && ctx.Err() == nil; i += repairBatch {
		found, err := r.check(ctx, ids[i:min(i+repairBatch, len(ids))], finished)
		h.OfferChecked(found)
		if err != nil {
			failed("tasks", len(ids), err)
		}
	}
	scopes := h.RepairScopes()
	// A scope first listed reaches back to when it began to be watched:
	// rounds may come 8 intervals apart. Further back there is nothing a
	// round could have missed, only markers Redis lost.
	oldest := time.Now().Add(-(interval<<repairMaxBackoff + interval)).UnixMilli()
	for i := range scopes {
		scopes[i].WatchedSince = max(scopes[i].WatchedSince, oldest)
	}
	slices.SortFunc(scopes, func(a, b snapshot.Scope) int {
		return cmp.Or(cmp.Compare(a.TenantID, b.TenantID), cmp.Compare(a.ProjectID, b.ProjectID), cmp.Compare(a.UserID, b.UserID))
	})
	for i := 0; i < len(scopes) && ctx.Err() == nil; i += repairBatch {
		found, err := r.list(ctx, scopes[i:min(i+repairBatch, len(scopes))])
		h.OfferChecked(found)
		if err != nil {
			failed("scopes", len(scopes), err)
		}
	}
	return ok
}

// errCheckSkipped and errCheckSlow make the rounds back off while
// PostgreSQL is busy or slow.
var (
	errCheckSkipped = errors.New("repair: postgres busy, database part skipped")
	errCheckSlow    = errors.New("repair: postgres slow")
)

// check is a round's check of a batch of watched tasks (checkTasks),
// whose repairs the node's publisher stores and announces. finished asks
// for the tasks last found finished too.
func (r *Repairer) check(ctx context.Context, ids []string, finished bool) (hub.Checked, error) {
	res, err := r.checkTasks(ctx, checkRequest{IDs: ids, Hold: r.hold, Finished: finished, Publish: r.publish})
	out := hub.Checked{Found: make([]*snapshot.Snapshot, 0, len(res.Found)), Repaired: res.Repaired}
	repaired := make(map[string]bool, len(res.Repaired))
	for _, s := range res.Repaired {
		repaired[s.TaskID] = true
	}
	for id, s := range res.Found {
		if !repaired[id] {
			out.Found = append(out.Found, s)
		}
	}
	return out, checkErr(err, res.Skipped, res.Slow)
}

// list is a round's listing of a batch of watched scopes' changes since
// their last listing (checkScopes), looking back a whole interval (twice
// the hold) behind it: Found are the changes Redis holds, which it
// announced again, Repaired those it published.
func (r *Repairer) list(ctx context.Context, scopes []snapshot.Scope) (hub.Checked, error) {
	res, err := r.checkScopes(ctx, scopeCheckRequest{
		Scopes: scopes, Hold: r.hold, LookBack: 2 * r.hold, Publish: r.publish, Announce: r.announcer.Announce,
	})
	return hub.Checked{Found: res.Announced, Repaired: res.Repaired}, checkErr(err, res.Skipped, res.Slow)
}

func checkErr(err error, skipped, slow bool) error {
	switch {
	case err != nil:
		return err
	case skipped:
		return errCheckSkipped
	case slow:
		return errCheckSlow
	}
	return nil
}

func (r *Repairer) publish(ctx context.Context, s *snapshot.Snapshot) error {
	_, err := r.publisher.Publish(ctx, s)
	return err
}
