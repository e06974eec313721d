package node

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/pushd/pushd/auth/session"
	"github.com/pushd/pushd/converge"
	"github.com/pushd/pushd/db"
	"github.com/pushd/pushd/fanout"
	"github.com/pushd/pushd/hub"
	"github.com/pushd/pushd/keys"
	"github.com/pushd/pushd/node/internal/metrics"
	"github.com/pushd/pushd/snapshot"
	"github.com/pushd/pushd/snapshot/store"
	"github.com/pushd/pushd/stream"
)

// backend is what a mode gives the node: where snapshots are read and
// published, the bus the hub hears, the stores behind sessions and
// admission, and how to release it all. newEmbedded, newStandalone and
// newCluster fill it; the node builds the same hub, transports and API on
// any of them.
type backend struct {
	source    snapshot.Source
	publisher fanout.Publisher
	announcer *fanout.RedisPublisher // publisher's, for the repair's announcements; nil in the embedded mode
	published *countingPublisher     // publisher, counted for pubsub_publish_total
	bus       fanout.Bus
	hubBus    hub.Bus    // bus, or the tailer's view of it with streams
	hubStream hub.Stream // a nil interface without streams

	// Nil in the embedded mode.
	store    *store.Store
	busStats metrics.BusStats
	cache    redis.UniversalClient // the store's: snapshots, and the repair's markers
	control  redis.UniversalClient // admission limits, leases and sessions
	names    keys.Names
	// redisPools are the Redis clients by the roles they serve, for metrics.
	redisPools map[string]metrics.RedisPool
	sessions   *session.Store
	ready      func(context.Context) (map[string]string, error)

	pool   *pgxpool.Pool  // nil without PostgreSQL
	tailer *stream.Tailer // nil without streams
	// reconciler announces what died between its write and its
	// announcement: only on Redis Cluster and split Redis, where those are
	// two steps (nil elsewhere).
	reconciler *converge.Reconciler
	// changes publishes what PostgreSQL commits, while this node holds
	// the fleet's lease: with ReadChanges only (nil otherwise).
	changes *converge.ChangeReader
	// repairer runs the repair rounds: on every Redis mode (nil embedded,
	// where nothing is lost).
	repairer *converge.Repairer

	closers []func() // in the order they were made; close runs them backwards
	attrs   []any    // how the mode runs, for the start-up log line
}

func (b *backend) onClose(f func()) { b.closers = append(b.closers, f) }

// postgresPool is the pool for the metrics: nil, not a nil *pgxpool.Pool,
// without PostgreSQL.
func (b *backend) postgresPool() metrics.PostgresPool {
	if b.pool == nil {
		return nil
	}
	return b.pool
}

// close releases the backend, the last thing made first. The node has
// closed the hub and admission by then: nothing delivers or counts any
// more, and what the bus, tailer and store still run stops before the
// clients they run on.
func (b *backend) close() {
	for i := len(b.closers) - 1; i >= 0; i-- {
		b.closers[i]()
	}
	b.closers = nil
}

// stopDelivering ends the jobs that deliver to the hub on their own (the
// repair rounds), so the hub can close; close releases the rest.
func (b *backend) stopDelivering() {
	if b.repairer != nil {
		b.repairer.Close()
	}
}

// start hands the hub to what delivers to it, and starts the fleet's
// jobs; the repair rounds unless a test runs without them.
func (b *backend) start(h *hub.Hub, t TestTuning) {
	b.bus.Start(h)
	if b.tailer != nil {
		b.tailer.Start(h)
	}
	if b.reconciler != nil {
		b.reconciler.Start()
	}
	if b.changes != nil {
		b.changes.Start()
	}
	if b.repairer != nil && !t.NoRepair {
		b.repairer.Start(h)
	}
}

// newBackend builds cfg's mode. On an error, what was made is released.
func newBackend(ctx context.Context, cfg Config, t TestTuning) (*backend, error) {
	var b *backend
	var err error
	switch {
	case cfg.Embedded():
		b = newEmbedded()
	case cfg.RedisCluster:
		b, err = newCluster(ctx, cfg, t)
	default:
		b, err = newStandalone(ctx, cfg, t)
	}
	if err != nil {
		return nil, err
	}
	b.published = &countingPublisher{Publisher: b.publisher}
	b.publisher = b.published
	if cfg.ReadChanges && b.pool != nil {
		b.addChangeReader(cfg)
	}
	if b.store != nil {
		b.addRepairer(cfg)
	}
	return b, nil
}

// addRepairer makes the repair rounds over the store, whose repairs the
// node's publisher, counted, stores and announces, as a Task State
// Service would have. They run once the backend starts; stopDelivering
// ends them before the hub they deliver to, ahead of this closer.
func (b *backend) addRepairer(cfg Config) {
	b.repairer = converge.NewRepairer(converge.RepairConfig{
		Store: b.store, Redis: b.cache, Names: b.names, Publisher: b.publisher, Announcer: b.announcer, Logger: cfg.Logger,
	})
	b.onClose(b.repairer.Close) // before the store and the clients it reads
}

// repairStats is the repairer for the metrics: a nil interface without
// one.
func (b *backend) repairStats() metrics.RepairStats {
	if b.repairer == nil {
		return nil
	}
	return b.repairer
}

// addChangeReader makes the node's change reader, publishing through the
// node's publisher with its lease on the control Redis, where the fleet's
// other leases are. It runs once the backend starts.
func (b *backend) addChangeReader(cfg Config) {
	b.changes = converge.NewChangeReader(converge.ChangesConfig{
		Listen: b.pool.Config().ConnConfig, Rows: b.store, Publisher: b.publisher,
		Redis: b.control, Names: b.names, Node: cfg.NodeName, Logger: cfg.Logger,
	})
	b.onClose(b.changes.Close) // before the store, the pool and Redis
	b.attrs = append(b.attrs, "read_changes", true)
}

// newEmbedded is one node in memory: the publisher writes the store and
// announces on the bus in one step.
func newEmbedded() *backend {
	memory := snapshot.NewMemoryStore()
	bus := fanout.NewMemoryBus()
	b := &backend{source: memory, publisher: &fanout.MemoryPublisher{Store: memory, Bus: bus}, bus: bus, hubBus: bus}
	b.onClose(func() { bus.Close() })
	return b
}

// redisRoles are a Redis mode's clients, by role; one client may serve
// several.
type redisRoles struct {
	cache, control, realtime redis.UniversalClient
}

// pools are the distinct clients among the roles, each named by the roles
// it serves, for the pool metrics.
func (r redisRoles) pools() map[string]metrics.RedisPool {
	var clients []redis.UniversalClient
	roles := map[redis.UniversalClient]string{}
	for _, rc := range []struct {
		role string
		c    redis.UniversalClient
	}{{"cache", r.cache}, {"control", r.control}, {"realtime", r.realtime}} {
		if _, ok := roles[rc.c]; ok {
			roles[rc.c] += "+" + rc.role
			continue
		}
		clients = append(clients, rc.c)
		roles[rc.c] = rc.role
	}
	pools := make(map[string]metrics.RedisPool, len(clients))
	for _, c := range clients {
		pools[roles[c]] = c
	}
	return pools
}

// redisMode is what a Redis mode made before finishRedis completes it.
type redisMode struct {
	roles redisRoles
	names keys.Names
	bus   interface {
		fanout.Bus
		metrics.BusStats
	}
	// publisher stores and announces for POST /v1/publish and the repair
	// rounds, appending to the tenant's stream with Config.Streams
	// (publisherOptions).
	publisher *fanout.RedisPublisher
}

// publisherOptions are the options of a Redis mode's publisher under cfg.
func publisherOptions(cfg Config) []fanout.PublisherOption {
	if !cfg.Streams {
		return nil
	}
	return []fanout.PublisherOption{fanout.WithStream(cfg.StreamMaxLen)}
}

// finishRedis completes a Redis mode whose clients, bus and publisher are
// made: the PostgreSQL pool, the read store, sessions and, with streams,
// the tailer.
func (b *backend) finishRedis(ctx context.Context, cfg Config, t TestTuning, m redisMode) error {
	r, names, bus := m.roles, m.names, m.bus
	b.bus, b.hubBus, b.busStats, b.publisher, b.announcer, b.control, b.names = bus, bus, bus, m.publisher, m.publisher, r.control, names
	b.redisPools = r.pools()
	b.onClose(func() { bus.Close() })
	if cfg.DatabaseURL != "" {
		if err := b.openDatabase(ctx, cfg); err != nil {
			return err
		}
	}
	b.cache = r.cache
	b.store = store.New(store.Config{Redis: r.cache, DB: b.pool, Names: names, FetchTimeout: t.SnapshotFetchTimeout, Logger: cfg.Logger})
	b.onClose(func() { b.store.Close() }) // waits for fetches callers gave up on, before their clients go
	b.source = b.store
	b.ready = readiness(cfg, r.cache, b.pool)
	scfg := cfg.Sessions
	scfg.Redis, scfg.DB, scfg.Prefix, scfg.Logger = r.control, b.pool, cfg.KeyPrefix, cfg.Logger
	b.sessions = session.New(scfg)
	if cfg.Streams {
		// The realtime role is the standalone Redis or the cluster; on a
		// cluster the publisher appends in the tenant's slot after the
		// snapshot write (rediswrite.Announce), and the tailer keeps a
		// blocking read per stream on its master.
		sc := cfg.Stream
		sc.Client, sc.Names, sc.Logger = r.realtime, names, cfg.Logger
		b.tailer = stream.NewTailer(sc)
		b.onClose(func() { b.tailer.Close() })
		b.hubBus, b.hubStream = b.tailer.Subscriber(bus), b.tailer
	}
	if names.Cluster || r.cache != r.realtime {
		b.addReconciler(cfg, r, names, bus)
	}
	b.attrs = append(b.attrs, "postgres", b.pool != nil, "streams", cfg.Streams)
	return nil
}

// addReconciler makes the reconcile of the unannounced journal of the
// tenants bus watches, for modes whose publish writes and announces in two
// steps. It runs once the backend starts.
func (b *backend) addReconciler(cfg Config, r redisRoles, names keys.Names, bus fanout.Bus) {
	rc := cfg.Reconcile
	rc.Snapshots, rc.Realtime, rc.Names, rc.Tenants, rc.Logger = r.cache, r.realtime, names, subscribedOf(bus), cfg.Logger
	if cfg.Streams {
		rc.StreamMaxLen = cfg.StreamMaxLen
	}
	b.reconciler = converge.NewReconciler(rc)
	b.onClose(b.reconciler.Close) // before the clients it reads
}

// reconcileStats is the reconciler for the metrics: a nil interface
// without one.
func (b *backend) reconcileStats() metrics.ReconcileStats {
	if b.reconciler == nil {
		return nil
	}
	return b.reconciler
}

// changeStats is the change reader for the metrics: a nil interface
// without one.
func (b *backend) changeStats() metrics.ChangeStats {
	if b.changes == nil {
		return nil
	}
	return b.changes
}

// subscribedOf is the tenants a Redis bus holds a subscription for.
func subscribedOf(bus fanout.Bus) func() []string {
	s, ok := bus.(interface{ Subscribed() []string })
	if !ok {
		return func() []string { return nil }
	}
	return s.Subscribed
}

// openDatabase makes the PostgreSQL pool. Connections are made lazily: a
// node starts while PostgreSQL is down and serves from Redis meanwhile.
func (b *backend) openDatabase(ctx context.Context, cfg Config) error {
	pcfg, err := pgxpool.ParseConfig(cfg.DatabaseURL)
	if err != nil {
		return fmt.Errorf("database url: %w", err)
	}
	// Without pool_max_conns pgxpool keeps the greater of 4 and the
	// CPUs: fewer connections than the fallback reads and session lookups
	// may run at once, whose queries then wait for one, the reads that
	// deliver notifications behind a herd of new connections' (the store
	// keeps half of its slots for them, which a smaller pool undoes).
	if !strings.Contains(cfg.DatabaseURL, "pool_max_conns") {
		pcfg.MaxConns = int32(store.DefaultMaxDBQueries + cmp.Or(max(cfg.Sessions.MaxDBQueries, 0), session.DefaultMaxDBQueries))
	}
	if pcfg.MaxConns > 16 {
		pcfg.MaxConns = 16 // the fallback is capped below this anyway
	}
	if b.pool, err = pgxpool.NewWithConfig(ctx, pcfg); err != nil {
		return fmt.Errorf("database: %w", err)
	}
	b.onClose(b.pool.Close)
	checkDatabase(ctx, cfg, b.pool, &pcfg.ConnConfig.Config)
	return nil
}

// dbCheckTimeout bounds the start-up check of PostgreSQL.
const dbCheckTimeout = 2 * time.Second

// checkDatabase warns when PostgreSQL does not answer at start. The node
// starts anyway and the pool connects once it answers; but without this,
// nothing would say so until the first read Redis cannot serve. The
// address is logged, never the password (nor pgx's errors carry it).
func checkDatabase(ctx context.Context, cfg Config, pool *pgxpool.Pool, c *pgconn.Config) {
	ctx, cancel := context.WithTimeout(ctx, dbCheckTimeout)
	defer cancel()
	missing, err := db.Missing(ctx, pool)
	if err != nil {
		cfg.Logger.Warn("postgres does not answer at start; serving from Redis until it does",
			"addr", net.JoinHostPort(c.Host, strconv.Itoa(int(c.Port))), "database", c.Database, "user", c.User, "err", err)
		return
	}
	if i := slices.Index(missing, db.ChangesMigration); i >= 0 {
		missing = slices.Delete(missing, i, i+1)
		if cfg.ReadChanges {
			cfg.Logger.Warn("--read-changes: postgres lacks the trigger that announces committed changes: a row committed alone reaches no one until a repair round finds it; apply "+db.ChangesMigration,
				"database", c.Database)
		}
	}
	if len(missing) > 0 {
		cfg.Logger.Warn("postgres lacks part of the schema pushd reads: apply every file of db/migrations (the Task State Service owns the schema in production)",
			"missing", strings.Join(missing, ","), "database", c.Database)
	}
}

// readiness is /readyz's check: the node can serve while either snapshot
// source answers, unless PostgreSQL answers without the table of tasks, a
// node that would answer every read it cannot serve from Redis with 503.
// Both are asked at once, so a stalled one cannot spend the other's
// deadline. /readyz is public, so its checks give each source's state
// only; why a source is down goes to the log.
func readiness(cfg Config, cache redis.UniversalClient, pool *pgxpool.Pool) func(context.Context) (map[string]string, error) {
	sources := &sourceStates{log: cfg.Logger, down: map[string]bool{}}
	return func(ctx context.Context) (map[string]string, error) {
		var redisErr, pgErr error
		var missing []string
		var wg sync.WaitGroup
		wg.Go(func() { redisErr = cache.Ping(ctx).Err() })
		if pool != nil {
			wg.Go(func() { missing, pgErr = db.Missing(ctx, pool) })
		}
		wg.Wait()
		if slices.Contains(missing, db.TasksMigration) {
			pgErr = errNoTasksTable
		}
		// A probe its caller gave up on says nothing about the sources; were
		// it counted, hanging up on /readyz would make them flap in the log.
		record := !errors.Is(ctx.Err(), context.Canceled)
		checks := map[string]string{"redis": sources.state("redis", redisErr, record), "postgres": "not configured"}
		if pool != nil {
			checks["postgres"] = sources.state("postgres", pgErr, record)
		}
		switch {
		case errors.Is(pgErr, errNoTasksTable):
			checks["postgres"] = "schema missing"
			return checks, pgErr
		case redisErr == nil || (pool != nil && pgErr == nil):
			return checks, nil
		}
		return checks, errors.New("no snapshot source answers")
	}
}

var errNoTasksTable = errors.New("postgres has no generation_tasks table: apply db/migrations")

// sourceStates remembers whether each snapshot source was down at the last
// probe, so that a source's error is logged when its state changes, not on
// every probe: anyone may ask /readyz, as often as they like.
type sourceStates struct {
	log  *slog.Logger
	mu   sync.Mutex
	down map[string]bool
}

// state is a source's check, "ok" or "down"; with record, a change from the
// last recorded state is logged, with err when the source went down.
func (s *sourceStates) state(source string, err error, record bool) string {
	if record {
		s.mu.Lock()
		was := s.down[source]
		s.down[source] = err != nil
		s.mu.Unlock()
		switch {
		case err != nil && !was:
			s.log.Warn("snapshot source down", "source", source, "err", err)
		case err == nil && was:
			s.log.Info("snapshot source answers again", "source", source)
		}
	}
	if err != nil {
		return "down"
	}
	return "ok"
}

// Buffer sizes of the nodes' Redis connections, where the URL sets none.
// go-redis gives every pooled connection a 32 KiB reader and writer, and
// every pipeline connection 128 KiB of each, sized for large values and
// long batches. pushd's replies are snapshots of some hundreds of bytes and
// its batches a few hundred of those at most, and the pools a connect burst
// grows stay: at 10,000 idle SSE connections go-redis held 3.6 MB of the
// node's 31 MB heap, 0.8 MB at these sizes. A reply larger than the buffer
// is read in more calls, never refused.
const (
	redisBufferSize         = 8 << 10
	redisPipelineBufferSize = 16 << 10
)
