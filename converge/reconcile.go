package converge

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"log/slog"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pushd/pushd/internal/flagval"
	"github.com/pushd/pushd/keys"
	"github.com/pushd/pushd/snapshot"
	"github.com/pushd/pushd/snapshot/rediswrite"
)

// The reconcile's bounds, documented in docs/DESIGN.md, "Publishing".
const (
	// reconcileLimit is how many journal entries of one tenant a round
	// reads, oldest first.
	reconcileLimit = 100
	// abandonAge is how old an entry whose version is not stored must be
	// before a reconcile removes it: its publisher died before the write,
	// or is so slow that its write is not expected any more. Well past the
	// grace, so a slow publisher or a clock a little behind the node's
	// does not lose its entry while its write is still coming.
	abandonAge = time.Minute
	// reconcileTimeout bounds one round.
	reconcileTimeout = 5 * time.Second
)

// ReconcileConfig configures a Reconciler. Snapshots, Realtime and Tenants
// are required.
type ReconcileConfig struct {
	// Snapshots is the client of the cache role, where snapshots are
	// stored; Realtime the client of the realtime role, where the journal
	// and the channels are. The same *redis.ClusterClient on Redis Cluster.
	Snapshots, Realtime redis.UniversalClient
	// Names must be the publishers' names.
	Names keys.Names
	// Tenants returns the tenants to reconcile: those the node watches (the
	// bus's Subscribed).
	Tenants func() []string
	// StreamMaxLen > 0 makes a repair append to the tenant's stream too, as
	// a publisher WithStream does.
	StreamMaxLen int64
	// Interval is the time between two rounds, jittered by ±20 %. Zero
	// means 5s.
	Interval time.Duration
	// Grace is how old an entry must be before a round looks at it, so a
	// publish in flight finishes first. Zero means 2s.
	Grace time.Duration
	// Logger receives the reconcile's errors. Nil means slog.Default().
	Logger *slog.Logger
}

// RegisterFlags defines on fs a flag for each setting of c an operator
// sets, bound to its field, with the field's value as its default: call it
// on a Config with its defaults (DefaultConfig or WithDefaults).
func (c *ReconcileConfig) RegisterFlags(fs *flag.FlagSet) {
	flagval.Duration(fs, &c.Interval, "announce-reconcile-interval", "on Redis Cluster or with the cache and realtime roles apart, how often (jittered) this node announces the stored snapshots of watched tenants whose publisher died before announcing them")
}

// WithDefaults returns c with each zero setting that has a default set to
// it; it is the one place those defaults are written.
func (c ReconcileConfig) WithDefaults() ReconcileConfig {
	if c.Interval <= 0 {
		c.Interval = 5 * time.Second
	}
	if c.Grace <= 0 {
		c.Grace = 2 * time.Second
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

// Reconciler repairs publishes that stored a snapshot and died before
// announcing it: on Redis Cluster, or with the cache and realtime roles on
// two Redis servers, a publish journals itself in the tenant's unannounced
// journal before it writes, and removes the entry when it announces
// (rediswrite.Journal, rediswrite.Announce). Every Interval the reconciler
// reads, for each tenant the node watches, up to 100 entries older than
// Grace (one pipelined ZRANGE, so one round trip per master); for each it
// reads the stored snapshot and, when that is this tenant's and of the
// entry's version or newer, announces it as a publisher's retry would
// (which removes the entry); an entry whose version was never stored is
// removed once it is a minute old. Several nodes reconciling one tenant
// only repeat an announcement of a stored version, which nodes drop as not
// newer.
type Reconciler struct {
	cfg ReconcileConfig

	rounds, repairs, abandoned, errs atomic.Uint64

	stop chan struct{}
	once sync.Once
	wg   sync.WaitGroup
}

// ReconcileStats are a Reconciler's monotonic counters.
type ReconcileStats struct {
	Rounds    uint64 // rounds run
	Repairs   uint64 // announcements a round made for an entry whose version was stored
	Abandoned uint64 // entries removed because their version was never stored
	Errors    uint64 // rounds in which a read or a repair failed on Redis
}

// NewReconciler returns a reconciler; Start runs it.
func NewReconciler(cfg ReconcileConfig) *Reconciler {
	return &Reconciler{cfg: cfg.WithDefaults(), stop: make(chan struct{})}
}

// Start runs rounds until Close.
func (r *Reconciler) Start() {
	r.wg.Go(func() {
		for {
			jitter := 0.8 + 0.4*rand.Float64()
			t := time.NewTimer(time.Duration(float64(r.cfg.Interval) * jitter))
			select {
			case <-r.stop:
				t.Stop()
				return
			case <-t.C:
			}
			ctx, cancel := context.WithTimeout(context.Background(), reconcileTimeout)
			if err := r.round(ctx); err != nil {
				r.cfg.Logger.Warn("announce reconcile", "err", err)
			}
			cancel()
		}
	})
}

// Close stops the rounds and waits for the one running. It is idempotent.
func (r *Reconciler) Close() {
	r.once.Do(func() { close(r.stop) })
	r.wg.Wait()
}

// Stats returns the counters so far.
func (r *Reconciler) Stats() ReconcileStats {
	return ReconcileStats{Rounds: r.rounds.Load(), Repairs: r.repairs.Load(), Abandoned: r.abandoned.Load(), Errors: r.errs.Load()}
}

// pendingEntry is a journal entry a round read, with its tenant.
type pendingEntry struct {
	tenant string
	p      rediswrite.Pending
}

// round runs one round.
func (r *Reconciler) round(ctx context.Context) error {
	r.rounds.Add(1)
	entries, err := r.pending(ctx)
	if len(entries) > 0 {
		err = errors.Join(err, r.repair(ctx, entries))
	}
	if err != nil {
		r.errs.Add(1)
	}
	return err
}

// pending reads the entries older than the grace of every tenant watched,
// oldest first, up to reconcileLimit a tenant, in one pipeline.
func (r *Reconciler) pending(ctx context.Context) ([]pendingEntry, error) {
	tenants := r.cfg.Tenants()
	if len(tenants) == 0 {
		return nil, nil
	}
	upTo := strconv.FormatInt(time.Now().Add(-r.cfg.Grace).UnixMilli(), 10)
	pipe := r.cfg.Realtime.Pipeline()
	cmds := make([]*redis.ZSliceCmd, len(tenants))
	for i, t := range tenants {
		cmds[i] = pipe.ZRangeArgsWithScores(ctx, redis.ZRangeArgs{
			Key: r.cfg.Names.Unannounced(t), Start: "-inf", Stop: upTo, ByScore: true, Count: reconcileLimit,
		})
	}
	_, _ = pipe.Exec(ctx) // each command holds its own error
	var entries []pendingEntry
	var errs []error
	for i, cmd := range cmds {
		zs, err := cmd.Result()
		if err != nil {
			errs = append(errs, err)
			continue
		}
		for _, z := range zs {
			member, _ := z.Member.(string)
			if p, ok := rediswrite.ParsePending(member, z.Score); ok {
				entries = append(entries, pendingEntry{tenants[i], p})
			}
		}
	}
	return entries, errors.Join(errs...)
}

// repair reads the stored snapshot of each entry's task (one pipeline) and
// announces it, or removes an entry whose version was never stored.
func (r *Reconciler) repair(ctx context.Context, entries []pendingEntry) error {
	pipe := r.cfg.Snapshots.Pipeline()
	gets := make([]*redis.StringCmd, len(entries))
	for i, e := range entries {
		gets[i] = pipe.Get(ctx, r.cfg.Names.Snapshot(e.p.TaskID))
	}
	_, _ = pipe.Exec(ctx)
	abandonBefore := time.Now().Add(-abandonAge).UnixMilli()
	var errs []error
	for i, e := range entries {
		doc, err := gets[i].Bytes()
		if err != nil && !errors.Is(err, redis.Nil) {
			errs = append(errs, err)
			continue
		}
		stored, _ := snapshot.Parse(doc)
		switch {
		case stored != nil && stored.TenantID == e.tenant && stored.Version >= e.p.Version:
			err = r.announce(ctx, stored, e.p)
		case e.p.Since <= abandonBefore:
			var removed bool
			if removed, err = rediswrite.Forget(ctx, r.cfg.Realtime, r.cfg.Names, e.tenant, e.p); removed {
				r.abandoned.Add(1)
			}
		}
		if err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// announce announces stored as a retry would, removing p.
func (r *Reconciler) announce(ctx context.Context, stored *snapshot.Snapshot, p rediswrite.Pending) error {
	// The hint a publisher sends (fanout.RedisPublisher), byte for byte.
	msg, err := json.Marshal(snapshot.NotificationFor(stored))
	if err != nil {
		return err
	}
	_, err = rediswrite.Announce(ctx, r.cfg.Realtime, r.cfg.Names, rediswrite.Announcement{
		Snapshot: stored, Outcome: rediswrite.Current, Pending: p,
		Channel: r.cfg.Names.Channel(stored.TenantID), Message: msg, StreamMaxLen: r.cfg.StreamMaxLen,
	})
	if err == nil {
		r.repairs.Add(1)
	}
	return err
}
