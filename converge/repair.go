package converge

import (
	"context"
	"errors"
	"log/slog"
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
	// Interval is the time between two repair rounds: the hub's
	// Config.RepairInterval. A claim holds for half of it, less than any
	// node's next round. Zero means hub.DefaultRepairInterval.
	Interval time.Duration
	// Logger receives the repairs and their failures. Nil means
	// slog.Default().
	Logger *slog.Logger
}

// Repairer is the repair rounds' checks on a Redis mode: each round's
// batches of watched tasks and scopes are read from Redis and, for what
// this node claims for the fleet, from PostgreSQL; what PostgreSQL holds
// newer is published with the node's publisher, and what a scope's
// listing finds in Redis is announced again, as a Task State Service would
// have (docs/DESIGN.md, "Repair: changes never announced"). It is the
// hub's Checker.
type Repairer struct {
	store     *store.Store
	rdb       redis.UniversalClient
	names     keys.Names
	publisher fanout.Publisher
	announcer *fanout.RedisPublisher
	hold      time.Duration // how long a claim keeps the fleet's other nodes away
	log       *slog.Logger

	stats repairCounters
}

var _ hub.Checker = (*Repairer)(nil)

// RepairStats are a Repairer's counters since it was made.
type RepairStats struct {
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
	checked, checkQueries, checkErrors, checkRows atomic.Uint64
	checkSkipped, repaired, scopesListed          atomic.Uint64
	announced                                     atomic.Uint64
}

// NewRepairer returns the checks of the repair rounds.
func NewRepairer(cfg RepairConfig) *Repairer {
	if cfg.Interval <= 0 {
		cfg.Interval = hub.DefaultRepairInterval
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &Repairer{
		store: cfg.Store, rdb: cfg.Redis, names: cfg.Names,
		publisher: cfg.Publisher, announcer: cfg.Announcer,
		hold: cfg.Interval / 2, log: cfg.Logger,
	}
}

// Stats returns the counters so far.
func (r *Repairer) Stats() RepairStats {
	c := &r.stats
	return RepairStats{
		Checked: c.checked.Load(), CheckQueries: c.checkQueries.Load(), CheckErrors: c.checkErrors.Load(),
		CheckRows: c.checkRows.Load(), CheckSkipped: c.checkSkipped.Load(), Repaired: c.repaired.Load(),
		ScopesListed: c.scopesListed.Load(), Announced: c.announced.Load(),
	}
}

// errCheckSkipped and errCheckSlow make the rounds back off while
// PostgreSQL is busy or slow.
var (
	errCheckSkipped = errors.New("repair: postgres busy, database part skipped")
	errCheckSlow    = errors.New("repair: postgres slow")
)

// Check checks a batch of watched tasks (checkTasks), whose repairs the
// node's publisher stores and announces.
func (r *Repairer) Check(ctx context.Context, ids []string, finished bool) (hub.Checked, error) {
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

// CheckScopes lists the scopes' changes since their last listing
// (checkScopes), looking back a whole interval (twice the hold) behind it.
func (r *Repairer) CheckScopes(ctx context.Context, scopes []snapshot.Scope) (hub.Checked, error) {
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
