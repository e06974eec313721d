package store

import (
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"golang.org/x/sync/singleflight"

	"github.com/pushd/pushd/internal/episode"
	"github.com/pushd/pushd/keys"
	"github.com/pushd/pushd/snapshot"
)

// Bounds of the in-process caches, in entries. A snapshot entry costs its
// document (a few hundred bytes) plus map overhead.
const (
	taskCacheCap     = 1 << 16
	negativeCacheCap = 1 << 16
	listCacheCap     = 1 << 12
)

// Config configures a Store. The zero value is valid: a Store with no source,
// whose reads all fail with ErrUnavailable.
type Config struct {
	// Redis holds the snapshots and the negative cache. Nil means no Redis:
	// reads go to PostgreSQL and SetIfNewer fails.
	Redis redis.UniversalClient
	// DB is the PostgreSQL fallback. Nil means none: a Redis miss is
	// ErrNotFound and ListProject/ListUser fail with ErrUnavailable.
	DB *pgxpool.Pool
	// Names spells the Redis keys. The zero value uses the names of
	// docs/DESIGN.md, "Key names".
	Names keys.Names
	// CacheTTL is how long a snapshot stays in the in-process cache. Zero
	// means 500ms; negative disables the cache.
	CacheTTL time.Duration
	// NegativeTTL is how long "no such task" is cached, in Redis and in
	// process. Zero means 30s; negative disables negative caching.
	NegativeTTL time.Duration
	// FetchTimeout bounds one shared fetch (Redis, then PostgreSQL), which
	// runs detached from the callers that wait for it, and a wait for a free
	// PostgreSQL slot. Zero means 3s.
	FetchTimeout time.Duration
	// StatementTimeout is PostgreSQL's statement_timeout for every query.
	// Zero means 2s.
	StatementTimeout time.Duration
	// MaxDBQueries caps concurrent PostgreSQL queries, so a Redis outage
	// cannot stampede the database. Queries for callers that can give up
	// (a connection's initial reads, the API, polls and repairs) hold at
	// most half of them, at least one: the rest stay for the hub's reads
	// of what notifications announce. Zero means 8.
	MaxDBQueries int
	// DBQueueWait is how long a read waits for one of the MaxDBQueries
	// slots before failing with ErrUnavailable. Zero means 1s.
	DBQueueWait time.Duration
	// ListCacheTTL is how long ListProject and ListUser results are cached.
	// Zero means 1s; negative disables the cache.
	ListCacheTTL time.Duration
	// Logger receives the failures the Store absorbs: Redis errors it
	// falls back to PostgreSQL on (a warning when Redis stops answering,
	// then summaries; each one at debug) and write-backs that failed (at
	// debug). Nil means slog.Default().
	Logger *slog.Logger
}

// withDefaults is the one place zero values become defaults.
func (c Config) withDefaults() Config {
	if c.CacheTTL == 0 {
		c.CacheTTL = 500 * time.Millisecond
	}
	if c.NegativeTTL == 0 {
		c.NegativeTTL = 30 * time.Second
	}
	if c.FetchTimeout <= 0 {
		c.FetchTimeout = 3 * time.Second
	}
	if c.StatementTimeout <= 0 {
		c.StatementTimeout = 2 * time.Second
	}
	if c.MaxDBQueries <= 0 {
		c.MaxDBQueries = DefaultMaxDBQueries
	}
	if c.DBQueueWait <= 0 {
		c.DBQueueWait = time.Second
	}
	if c.ListCacheTTL == 0 {
		c.ListCacheTTL = time.Second
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

// Stats are monotonic counters of a Store's work, for metrics and tests.
type Stats struct {
	RedisReads   uint64 // read round trips to Redis (GET with the negative-key check, MGET)
	RedisHits    uint64 // snapshots found in Redis
	RedisMisses  uint64 // snapshots absent from Redis (or undecodable there)
	RedisErrors  uint64 // Redis reads that failed (on Cluster, once per master a batch failed on); the Store fell back to PostgreSQL and skips Redis (on Cluster, that master) for a second
	DBQueries    uint64 // PostgreSQL queries sent
	DBMisses     uint64 // tasks PostgreSQL did not have
	DBErrors     uint64 // PostgreSQL queries that failed
	DBRejected   uint64 // queries not sent because MaxDBQueries were in flight for too long
	NegativeHits uint64 // reads answered "not found" by a negative cache (in process or Redis)
	CacheHits    uint64 // snapshots and lists served from the in-process caches
	WriteBacks   uint64 // snapshots read from PostgreSQL and written back to Redis

	CacheMisses    uint64 // reads the in-process caches could not answer (Reload, which skips them, not counted)
	RedisNegative  uint64 // NegativeHits answered by Redis's notfound key (the rest by the in-process one)
	RedisSkipped   uint64 // reads that skipped Redis for a second after it (on Cluster, the task's master) failed
	RedisPoolWaits uint64 // Redis reads whose time ran out waiting for one of the node's pooled connections: they fell back to PostgreSQL, and Redis was not skipped after them
	DBHits         uint64 // snapshots PostgreSQL returned
	SharedCalls    uint64 // reads that joined a fetch already in flight for the same task or list (singleflight)
	// CacheSets are the entries stored in the in-process caches: each
	// snapshot read from Redis or PostgreSQL (a listing's rows included) or
	// written by SetIfNewer, unless the cache held a newer version, and each
	// listing. Expired entries refreshed count again; "not found" does not.
	CacheSets uint64

	TenantMismatches uint64 // writes (SetIfNewer, write-backs) refused: Redis holds the task as another tenant's
	UnreadableStored uint64 // writes refused: the stored document's version or tenant could not be read
}

// counters are the live Stats.
type counters struct {
	redisReads, redisHits, redisMisses, redisErrors atomic.Uint64
	dbQueries, dbMisses, dbErrors, dbRejected       atomic.Uint64
	negativeHits, cacheHits, writeBacks             atomic.Uint64
	cacheMisses, redisNegative, redisSkipped        atomic.Uint64
	redisPoolWaits                                  atomic.Uint64
	dbHits, sharedCalls, cacheSets                  atomic.Uint64
	tenantMismatches, unreadableStored              atomic.Uint64
}

// Store reads snapshots through an in-process cache, singleflight per task,
// Redis, a negative cache and a bounded PostgreSQL fallback, and writes them
// with the SetIfNewer script. It is safe for concurrent use.
type Store struct {
	cfg   Config // defaults applied
	rdb   redis.UniversalClient
	db    *pgxpool.Pool
	names keys.Names
	log   *slog.Logger
	lost  *episode.Logger // failed Redis reads, until one succeeds

	// beginSQL opens a read-only transaction with the statement timeout.
	beginSQL string
	// sem holds a token per PostgreSQL query in flight. callerSem holds
	// one more per query of a caller that can give up (a connection's
	// initial reads, an API request, a resume, a poll or repair round),
	// taken first: such queries hold at most half of sem, so a herd of new
	// connections (a lost node's clients) never queues the reads that
	// deliver changes to the connections already open.
	sem       chan struct{}
	callerSem chan struct{}

	tasks   *cache[*snapshot.Snapshot] // newest snapshot seen per task id
	missing *cache[struct{}]           // task ids known to be absent
	// observed is the highest version notifications announced per task,
	// recently: a read that would answer older (a cached copy, or a fetch
	// in flight from before the change) is not the task's current state.
	observed *cache[int64]
	// writtenBack is the monotime a PostgreSQL read last had Redis hold
	// each task's row (or its absence), recently: a read whose own Redis
	// read began before then may have missed it by a moment, and reads
	// Redis again rather than PostgreSQL (readDB).
	writtenBack *cache[int64]
	lists       *cache[[]*snapshot.Snapshot] // list results per listKey

	flights     singleflight.Group // Redis, then PostgreSQL, per task id
	asks        redisAsks          // callers' Redis reads waiting to share an MGET
	dbFlights   singleflight.Group // PostgreSQL only, per task id
	listFlights singleflight.Group // per listKey

	// dbReads holds the PostgreSQL reads of tasks running now, by task id,
	// registered from before they wait for a slot until what they read is
	// cached and written back (readDB): Get's flights and GetMany's batches
	// share them, so a task is not queried twice at once.
	dbMu    sync.Mutex
	dbReads map[string]*dbRead // guarded by dbMu
	// absorbing is the newest caller's read still waiting for a slot,
	// which other callers' reads of other tasks join (readDB). Guarded by
	// dbMu.
	absorbing *dbRead
	// registered, when a test sets it, is called by readDB once it has
	// joined or registered the reads of its ids.
	registered func()
	// missedRedis, when a test sets it, is called by a read that missed
	// tasks in Redis, before it reads them from PostgreSQL.
	missedRedis func()

	// cluster is Redis when it is a Redis Cluster, whose reads back off
	// per master.
	cluster *redis.ClusterClient
	// redisRetryAt is the monotime before which reads skip Redis: all of
	// them, but on Cluster only before the client has a slot map.
	redisRetryAt atomic.Int64
	// masterRetryAt, on Cluster, is the monotime before which reads of the
	// keys a master serves skip Redis, by the master's address; masters
	// absent have none. A map is never changed once stored.
	masterRetryAt atomic.Pointer[map[string]int64]

	// closeMu guards closed; fetches register in inflight under its read
	// lock, so Close sees every fetch that started.
	closeMu  sync.RWMutex
	closed   bool
	inflight sync.WaitGroup

	stats counters
}

var (
	_ snapshot.Source = (*Store)(nil)
	_ snapshot.Writer = (*Store)(nil)
)

// DefaultMaxDBQueries is Config.MaxDBQueries's default.
const DefaultMaxDBQueries = 8

// New returns a Store reading from cfg.Redis and cfg.DB. It starts no
// goroutine of its own (its caches' sweeps run on timers, which stop once
// nothing is left to sweep); it does not own, and never closes, the clients.
func New(cfg Config) *Store {
	cfg = cfg.withDefaults()
	s := &Store{
		cfg:       cfg,
		rdb:       cfg.Redis,
		db:        cfg.DB,
		names:     cfg.Names,
		log:       cfg.Logger,
		lost:      episode.New(cfg.Logger, "snapshot: redis reads still failing, falling back to postgres"),
		beginSQL:  fmt.Sprintf("BEGIN READ ONLY; SET LOCAL statement_timeout = %d", max(cfg.StatementTimeout.Milliseconds(), 1)),
		sem:       make(chan struct{}, cfg.MaxDBQueries),
		callerSem: make(chan struct{}, max(1, cfg.MaxDBQueries/2)),
		tasks:     newCache[*snapshot.Snapshot](cfg.CacheTTL, taskCacheCap),
		// In process, "not found" lives no longer than a snapshot would: a
		// node that does not watch the tenant hears no notification that
		// could clear it. Redis's notfound key, which SetIfNewer clears, is
		// the long-lived one.
		missing: newCache[struct{}](min(cfg.NegativeTTL, cfg.CacheTTL), negativeCacheCap),
		lists:   newCache[[]*snapshot.Snapshot](cfg.ListCacheTTL, listCacheCap),
		// Longer than any fetch runs, so a fetch that started before a
		// change was announced cannot outlive what the announcement said.
		observed: newCache[int64](2*cfg.FetchTimeout, taskCacheCap),
		// Longer than any read runs from its Redis read to its query too.
		writtenBack: newCache[int64](2*cfg.FetchTimeout, taskCacheCap),
	}
	s.cluster, _ = cfg.Redis.(*redis.ClusterClient)
	s.tasks.remnant = versionOnly
	return s
}

// versionOnly is what the task cache keeps of an expired snapshot: its
// version, which remember still compares, without the document.
func versionOnly(snap *snapshot.Snapshot) *snapshot.Snapshot {
	return &snapshot.Snapshot{Version: snap.Version}
}

// isRemnant reports whether snap is a versionOnly remnant: every snapshot a
// source returns has a document.
func isRemnant(snap *snapshot.Snapshot) bool { return snap.JSON() == nil }

// Close waits for the fetches still running on behalf of callers that gave
// up, and makes later reads that miss the in-process cache fail with
// ErrUnavailable. It does not close the Redis or PostgreSQL clients. Close is
// idempotent.
func (s *Store) Close() {
	s.closeMu.Lock()
	s.closed = true
	s.closeMu.Unlock()
	s.inflight.Wait()
}

var errClosed = fmt.Errorf("%w: store closed", snapshot.ErrUnavailable)

// enter registers a fetch with Close; false means the Store is closed.
func (s *Store) enter() bool {
	s.closeMu.RLock()
	defer s.closeMu.RUnlock()
	if s.closed {
		return false
	}
	s.inflight.Add(1)
	return true
}

// Stats returns the counters so far.
func (s *Store) Stats() Stats {
	c := &s.stats
	return Stats{
		RedisReads:   c.redisReads.Load(),
		RedisHits:    c.redisHits.Load(),
		RedisMisses:  c.redisMisses.Load(),
		RedisErrors:  c.redisErrors.Load(),
		DBQueries:    c.dbQueries.Load(),
		DBMisses:     c.dbMisses.Load(),
		DBErrors:     c.dbErrors.Load(),
		DBRejected:   c.dbRejected.Load(),
		NegativeHits: c.negativeHits.Load(),
		CacheHits:    c.cacheHits.Load(),
		WriteBacks:   c.writeBacks.Load(),

		CacheMisses:    c.cacheMisses.Load(),
		RedisNegative:  c.redisNegative.Load(),
		RedisSkipped:   c.redisSkipped.Load(),
		RedisPoolWaits: c.redisPoolWaits.Load(),
		DBHits:         c.dbHits.Load(),
		SharedCalls:    c.sharedCalls.Load(),
		CacheSets:      c.cacheSets.Load(),

		TenantMismatches: c.tenantMismatches.Load(),
		UnreadableStored: c.unreadableStored.Load(),
	}
}

// FetchTimeout is Config.FetchTimeout, its default applied: what bounds
// one fetch, and one repair check of package converge, which reads Redis
// and PostgreSQL as a fetch does.
func (s *Store) FetchTimeout() time.Duration { return s.cfg.FetchTimeout }
