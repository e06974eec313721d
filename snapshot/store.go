package snapshot

import (
	"context"
	"errors"
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
)

// MaxMany bounds the ids of one GetMany call.
const MaxMany = 100

// MaxList bounds ListProject and ListUser: they return the MaxList most
// recently updated tasks.
const MaxList = 500

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
	// cannot stampede the database. Zero means 8.
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
		c.MaxDBQueries = 8
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
	RedisErrors  uint64 // Redis reads that failed; the Store fell back to PostgreSQL and skips Redis for a second
	DBQueries    uint64 // PostgreSQL queries sent
	DBMisses     uint64 // tasks PostgreSQL did not have
	DBErrors     uint64 // PostgreSQL queries that failed
	DBRejected   uint64 // queries not sent because MaxDBQueries were in flight for too long
	NegativeHits uint64 // reads answered "not found" by a negative cache (in process or Redis)
	CacheHits    uint64 // snapshots and lists served from the in-process caches
	WriteBacks   uint64 // snapshots read from PostgreSQL and written back to Redis

	CacheMisses   uint64 // reads the in-process caches could not answer (Reload, which skips them, not counted)
	RedisNegative uint64 // NegativeHits answered by Redis's notfound key (the rest by the in-process one)
	RedisSkipped  uint64 // reads that skipped Redis for a second after it failed
	DBHits        uint64 // snapshots PostgreSQL returned
	SharedCalls   uint64 // reads that joined a fetch already in flight for the same task or list (singleflight)

	TenantMismatches uint64 // writes (SetIfNewer, write-backs) refused: Redis holds the task as another tenant's
	UnreadableStored uint64 // writes refused: the stored document's version or tenant could not be read
}

// counters are the live Stats.
type counters struct {
	redisReads, redisHits, redisMisses, redisErrors atomic.Uint64
	dbQueries, dbMisses, dbErrors, dbRejected       atomic.Uint64
	negativeHits, cacheHits, writeBacks             atomic.Uint64
	cacheMisses, redisNegative, redisSkipped        atomic.Uint64
	dbHits, sharedCalls                             atomic.Uint64
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
	// sem holds a token per PostgreSQL query in flight.
	sem chan struct{}

	tasks   *cache[*Snapshot] // newest snapshot seen per task id
	missing *cache[struct{}]  // task ids known to be absent
	// observed is the highest version notifications announced per task,
	// recently: a read that would answer older (a cached copy, or a fetch
	// in flight from before the change) is not the task's current state.
	observed *cache[int64]
	lists    *cache[[]*Snapshot] // list results per listKey

	flights     singleflight.Group // Redis, then PostgreSQL, per task id
	dbFlights   singleflight.Group // PostgreSQL only, per task id
	listFlights singleflight.Group // per listKey

	// dbReads holds the PostgreSQL reads of tasks running now, by task id,
	// registered from before they wait for a slot until what they read is
	// cached and written back (readDB): Get's flights and GetMany's batches
	// share them, so a task is not queried twice at once.
	dbMu    sync.Mutex
	dbReads map[string]*dbRead // guarded by dbMu

	// redisRetryAt is the monotime before which reads skip Redis.
	redisRetryAt atomic.Int64

	// closeMu guards closed; fetches register in inflight under its read
	// lock, so Close sees every fetch that started.
	closeMu  sync.RWMutex
	closed   bool
	inflight sync.WaitGroup

	stats counters
}

var (
	_ Source = (*Store)(nil)
	_ Writer = (*Store)(nil)
)

// NewStore returns a Store reading from cfg.Redis and cfg.DB. It starts no
// goroutine; it does not own, and never closes, the clients.
func NewStore(cfg Config) *Store {
	cfg = cfg.withDefaults()
	return &Store{
		cfg:      cfg,
		rdb:      cfg.Redis,
		db:       cfg.DB,
		names:    cfg.Names,
		log:      cfg.Logger,
		lost:     episode.New(cfg.Logger, "snapshot: redis reads still failing, falling back to postgres"),
		beginSQL: fmt.Sprintf("BEGIN READ ONLY; SET LOCAL statement_timeout = %d", max(cfg.StatementTimeout.Milliseconds(), 1)),
		sem:      make(chan struct{}, cfg.MaxDBQueries),
		tasks:    newCache[*Snapshot](cfg.CacheTTL, taskCacheCap),
		// In process, "not found" lives no longer than a snapshot would: a
		// node that does not watch the tenant hears no notification that
		// could clear it. Redis's notfound key, which SetIfNewer clears, is
		// the long-lived one.
		missing: newCache[struct{}](min(cfg.NegativeTTL, cfg.CacheTTL), negativeCacheCap),
		lists:   newCache[[]*Snapshot](cfg.ListCacheTTL, listCacheCap),
		// Longer than any fetch runs, so a fetch that started before a
		// change was announced cannot outlive what the announcement said.
		observed: newCache[int64](2*cfg.FetchTimeout, taskCacheCap),
	}
}

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

var errClosed = fmt.Errorf("%w: store closed", ErrUnavailable)

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

		CacheMisses:   c.cacheMisses.Load(),
		RedisNegative: c.redisNegative.Load(),
		RedisSkipped:  c.redisSkipped.Load(),
		DBHits:        c.dbHits.Load(),
		SharedCalls:   c.sharedCalls.Load(),

		TenantMismatches: c.tenantMismatches.Load(),
		UnreadableStored: c.unreadableStored.Load(),
	}
}

// countRefusal counts a write the script refused, and returns err.
func (s *Store) countRefusal(err error) error {
	switch {
	case errors.Is(err, ErrTenantMismatch):
		s.stats.tenantMismatches.Add(1)
	case errors.Is(err, ErrStoredUnreadable):
		s.stats.unreadableStored.Add(1)
	}
	return err
}

// Get returns the task's snapshot: from the in-process cache when it holds
// version atLeast or newer, else from one fetch shared by every concurrent
// caller for the task (Redis, then PostgreSQL). A result older than atLeast
// means Redis lost a write, so Get then reads PostgreSQL once more.
func (s *Store) Get(ctx context.Context, taskID string, atLeast int64) (*Snapshot, error) {
	if !ValidID(taskID) {
		return nil, ErrInvalidID
	}
	// A subscriber's read (atLeast 0) may come after the notification of
	// the task's newest version was heard and before it was watched: it
	// must answer with that version, not one cached or fetched before it.
	if v, ok := s.observed.get(taskID); ok && v > atLeast {
		atLeast = v
	}
	if snap, ok := s.tasks.get(taskID); ok && snap.Version >= atLeast {
		s.stats.cacheHits.Add(1)
		return snap, nil
	}
	// A notification (atLeast > 0) proves the task exists now, whatever was
	// cached about it before.
	if atLeast <= 0 {
		if _, ok := s.missing.get(taskID); ok {
			s.stats.negativeHits.Add(1)
			return nil, ErrNotFound
		}
	}
	s.stats.cacheMisses.Add(1)
	fetch := func(dbOnly bool) func(context.Context) (*Snapshot, error) {
		return func(ctx context.Context) (*Snapshot, error) { return s.fetch(ctx, taskID, atLeast, dbOnly) }
	}
	snap, err := shared(ctx, s, &s.flights, taskID, fetch(false))
	if atLeast <= 0 || (err == nil && snap.Version >= atLeast) {
		return snap, err
	}
	if err != nil && !errors.Is(err, ErrNotFound) {
		return nil, err
	}
	// The flight this call joined may have started before the announced
	// version was written. One that starts now cannot have: the write
	// happened before the notification that brought us here. Read Redis
	// again before troubling PostgreSQL, which may lag Redis.
	if again, err2 := shared(ctx, s, &s.flights, taskID, fetch(false)); err2 == nil {
		snap, err = newest(snap, again), nil
		if snap.Version >= atLeast {
			return snap, nil
		}
	}
	// Redis lost the write (evicted, or restarted empty): ask PostgreSQL,
	// the fact source.
	if s.db != nil {
		if row, err3 := shared(ctx, s, &s.dbFlights, taskID, fetch(true)); err3 == nil {
			snap, err = newest(snap, row), nil
		}
	}
	// The newest version found, even if older than announced: delivering
	// it is better than nothing, and the next change or resync brings the
	// rest.
	return snap, err
}

// newest returns the newer of two snapshots, either of which may be nil.
func newest(a, b *Snapshot) *Snapshot {
	if a == nil || (b != nil && b.NewerThan(a.Version)) {
		return b
	}
	return a
}

// shared runs fetch once for every concurrent caller with the same key in g.
// The fetch runs detached from ctx, under FetchTimeout, so a caller that
// gives up does not fail the others; each caller still returns when its own
// ctx ends. A failed fetch is forgotten at once, so the next caller retries.
func shared[T any](ctx context.Context, s *Store, g *singleflight.Group, key string, fetch func(context.Context) (T, error)) (T, error) {
	// led is written by the fetch, which runs only for the caller that
	// started the flight, before its result is sent on ch.
	led := false
	ch := g.DoChan(key, func() (any, error) {
		led = true
		if !s.enter() {
			g.Forget(key)
			return nil, errClosed
		}
		defer s.inflight.Done()
		fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.cfg.FetchTimeout)
		defer cancel()
		v, err := fetch(fctx)
		if err != nil {
			g.Forget(key)
			return nil, err
		}
		return v, nil
	})
	var zero T
	select {
	case r := <-ch:
		if !led {
			s.stats.sharedCalls.Add(1)
		}
		if r.Err != nil {
			return zero, r.Err
		}
		return r.Val.(T), nil
	case <-ctx.Done():
		return zero, ctx.Err()
	}
}

// fetch reads one task for a shared flight. dbOnly skips Redis, whose copy
// was older than atLeast. atLeast > 0 also skips the negative caches.
func (s *Store) fetch(ctx context.Context, id string, atLeast int64, dbOnly bool) (*Snapshot, error) {
	// A caller that missed the cache just before the previous flight for
	// this task stored its result may start a new flight just after: answer
	// it from the cache, so a burst of callers costs one read.
	if snap, ok := s.tasks.get(id); ok && snap.Version >= atLeast {
		s.stats.cacheHits.Add(1)
		return snap, nil
	}
	if atLeast <= 0 {
		if _, ok := s.missing.get(id); ok {
			s.stats.negativeHits.Add(1)
			return nil, ErrNotFound
		}
	}

	var redisErr error // why Redis did not answer, if it did not
	if s.rdb != nil && !dbOnly {
		snap, missing, err := s.readRedis(ctx, id, atLeast <= 0 && s.cfg.NegativeTTL > 0)
		s.redisRead(ctx, err, "task_id", id)
		switch {
		case err != nil:
			redisErr = err
		case snap != nil:
			return s.remember(snap), nil
		case missing:
			s.stats.negativeHits.Add(1)
			s.stats.redisNegative.Add(1)
			s.markMissing(id)
			return nil, ErrNotFound
		case s.db == nil:
			// Redis is the only source and does not have the task.
			return nil, ErrNotFound
		}
	}
	if s.db == nil {
		return nil, unavailable(id, redisErr)
	}

	// dbOnly: Redis was older than announced, so only a read sent from now
	// on will do.
	res, err := s.readDB(ctx, []string{id}, atLeast, !dbOnly)
	defer res.release() // once cached and written back
	if err != nil {
		return nil, unavailable(id, errors.Join(redisErr, err))
	}
	snap := res.found[id]
	if len(res.rows)+len(res.absent) == 0 {
		// Another read's (which caches and writes it back), or the cache's.
		if snap == nil {
			return nil, ErrNotFound
		}
		return s.cachedIfNewer(snap), nil
	}
	// Redis missed, lost a write, or was skipped: tell it what PostgreSQL
	// said. Not after a Redis error: Redis is likely down, and waiting on it
	// again would only delay the answer.
	toRedis := s.rdb != nil && redisErr == nil && s.redisUsable()
	if snap == nil {
		s.setMissing(ctx, []string{id}, toRedis)
		return nil, ErrNotFound
	}
	if toRedis {
		s.writeBack(ctx, []*Snapshot{snap})
		return s.remember(snap), nil
	}
	return s.rememberFor(snap, standInTTL), nil
}

// unavailable wraps ErrUnavailable with what caused it.
func unavailable(id string, cause error) error {
	if cause == nil {
		return fmt.Errorf("get %s: %w: no source configured", id, ErrUnavailable)
	}
	return fmt.Errorf("get %s: %w: %w", id, ErrUnavailable, cause)
}

// standInTTL is how long a row read from PostgreSQL stays in process when
// Redis could not take its write-back (it failed a moment ago): the cached
// copy stands in for the Redis copy, so a storm of readers of the task
// while Redis is skipped costs one query, not one per CacheTTL. A change
// announced meanwhile drops it (Observe), and polling bypasses it.
const standInTTL = 3 * redisBackoff

// remember caches snap unless the cache holds a newer version, and returns
// the newer of the two: a source that lags behind what this node already saw
// must not move the node backwards.
func (s *Store) remember(snap *Snapshot) *Snapshot { return s.rememberFor(snap, 0) }

// rememberFor is remember with the entry kept for at least ttl.
func (s *Store) rememberFor(snap *Snapshot, ttl time.Duration) *Snapshot {
	newest := s.tasks.updateFor(snap.TaskID, ttl, func(old *Snapshot, present bool) *Snapshot {
		if present && old.Version > snap.Version {
			return old
		}
		return snap
	})
	// After the update, so a concurrent markMissing either sees the task or
	// has its entry deleted here: tasks are never deleted, so existence wins.
	s.missing.delete(snap.TaskID)
	return newest
}

// Cached reports whether Get(taskID, 0) would be answered from the
// in-process caches, without Redis or PostgreSQL.
func (s *Store) Cached(taskID string) bool {
	if _, ok := s.tasks.get(taskID); ok {
		return true
	}
	_, ok := s.missing.get(taskID)
	return ok
}

// Observe records that a notification announced version of the task: a
// cached copy older than that and a cached "not found" are dropped, so the
// next read goes to Redis. The hub calls it for every notification, watched
// or not, so a connection that subscribes later never starts from a copy
// this node knows is stale. It does no I/O.
func (s *Store) Observe(taskID string, version int64) {
	raise(s.observed, taskID, version)
	if snap, ok := s.tasks.get(taskID); ok && snap.Version < version {
		s.tasks.delete(taskID)
	}
	s.missing.delete(taskID)
}

// markMissing caches "not found" in process, unless this node meanwhile
// learned of the task.
func (s *Store) markMissing(id string) {
	s.missing.put(id, struct{}{})
	if _, ok := s.tasks.get(id); ok {
		s.missing.delete(id)
	}
}

// GetMany returns the snapshots of the tasks that exist, keyed by id. It
// serves what the in-process cache holds, reads the rest with one Redis MGET
// and what Redis lacks with one PostgreSQL query, and writes those back. It
// accepts at most MaxMany ids; more fail with ErrInvalidID, like a bad id,
// before any I/O.
func (s *Store) GetMany(ctx context.Context, taskIDs []string) (map[string]*Snapshot, error) {
	return s.getMany(ctx, taskIDs, true)
}

// Reload is GetMany without the in-process caches: resync and polling use
// it, because a copy cached while notifications were being lost may be
// stale. What it reads still refreshes the caches.
func (s *Store) Reload(ctx context.Context, taskIDs []string) (map[string]*Snapshot, error) {
	return s.getMany(ctx, taskIDs, false)
}

func (s *Store) getMany(ctx context.Context, taskIDs []string, cached bool) (map[string]*Snapshot, error) {
	if err := checkMany(taskIDs); err != nil {
		return nil, err
	}
	out := make(map[string]*Snapshot, len(taskIDs))
	var rest []string
	seen := make(map[string]bool, len(taskIDs))
	for _, id := range taskIDs {
		if seen[id] {
			continue
		}
		seen[id] = true
		if !cached {
			rest = append(rest, id)
			continue
		}
		if snap, ok := s.tasks.get(id); ok {
			s.stats.cacheHits.Add(1)
			out[id] = snap
			continue
		}
		if _, ok := s.missing.get(id); ok {
			s.stats.negativeHits.Add(1)
			continue
		}
		s.stats.cacheMisses.Add(1)
		rest = append(rest, id)
	}
	if len(rest) == 0 {
		return out, nil
	}
	if !s.enter() {
		return nil, errClosed
	}
	defer s.inflight.Done()
	ctx, cancel := context.WithTimeout(ctx, s.cfg.FetchTimeout)
	defer cancel()

	var redisErr error
	if s.rdb != nil {
		found, err := s.readRedisMany(ctx, rest)
		s.redisRead(ctx, err, "tasks", len(rest))
		if err != nil {
			redisErr = err
		} else {
			missed := rest[:0]
			for _, id := range rest {
				if snap := found[id]; snap != nil {
					out[id] = s.remember(snap)
				} else {
					missed = append(missed, id)
				}
			}
			rest = missed
		}
		if len(rest) == 0 || (redisErr == nil && s.db == nil) {
			return out, nil
		}
	}
	if s.db == nil {
		return nil, fmt.Errorf("get many: %w", unavailable(rest[0], redisErr))
	}

	// Tasks a Get's flight or another batch is reading from PostgreSQL
	// are waited for, not queried again.
	res, err := s.readDB(ctx, rest, 0, cached)
	defer res.release() // once cached and written back
	toRedis := s.rdb != nil && redisErr == nil && s.redisUsable()
	for _, row := range res.rows {
		if toRedis {
			out[row.TaskID] = s.remember(row)
		} else {
			// As in fetch: it stands in for the write-back Redis cannot take.
			out[row.TaskID] = s.rememberFor(row, standInTTL)
		}
	}
	if toRedis && len(res.rows) > 0 {
		s.writeBack(ctx, res.rows)
	}
	s.setMissing(ctx, res.absent, toRedis)
	if err != nil {
		return nil, fmt.Errorf("get many: %w: %w", ErrUnavailable, errors.Join(redisErr, err))
	}
	for id, snap := range res.found {
		if out[id] == nil { // another read's, or the cache's
			out[id] = s.cachedIfNewer(snap)
		}
	}
	return out, nil
}

// cachedIfNewer returns the cached copy of snap's task if it is newer, else
// snap. For a snapshot another read caches: remembering it again here
// would cut short the time a stand-in copy is kept.
func (s *Store) cachedIfNewer(snap *Snapshot) *Snapshot {
	if cur, ok := s.tasks.get(snap.TaskID); ok && cur.NewerThan(snap.Version) {
		return cur
	}
	return snap
}

// SetIfNewer writes s to Redis with the TTL its status calls for, if Redis
// holds no newer version, and caches it in process. It fails with
// ErrUnavailable when the Store has no Redis, and with ErrTenantMismatch or
// ErrStoredUnreadable when the write script refused it (see Write); a
// refused snapshot is not cached.
func (s *Store) SetIfNewer(ctx context.Context, snap *Snapshot) (bool, error) {
	if snap == nil {
		return false, errors.New("set: nil snapshot")
	}
	if s.rdb == nil {
		return false, fmt.Errorf("set %s: %w: no redis", snap.TaskID, ErrUnavailable)
	}
	written, err := Write(ctx, s.rdb, s.names, snap, TTLWithJitter(snap.Status), "", nil)
	if err != nil {
		return false, s.countRefusal(err)
	}
	// Even when Redis held a newer version, snap is a real version of a
	// task that exists: remember keeps the newer of it and the cached one.
	s.remember(snap)
	return written, nil
}

// ListProject returns the snapshots of a project's MaxList most recently
// updated tasks, newest first, from PostgreSQL (cached ListCacheTTL). A task
// this node has since seen in a newer version is returned in that version.
func (s *Store) ListProject(ctx context.Context, tenantID, projectID string) ([]*Snapshot, error) {
	if !ValidID(tenantID) || !ValidID(projectID) {
		return nil, ErrInvalidID
	}
	return s.list(ctx, projectListKey(tenantID, projectID), sqlTasksByProject, tenantID, projectID)
}

// ListUser returns the snapshots of a user's MaxList most recently updated
// tasks, like ListProject.
func (s *Store) ListUser(ctx context.Context, tenantID, userID string) ([]*Snapshot, error) {
	if !ValidID(tenantID) || !ValidID(userID) {
		return nil, ErrInvalidID
	}
	return s.list(ctx, userListKey(tenantID, userID), sqlTasksByUser, tenantID, userID)
}

// The keys of the list cache cannot collide between kinds because ids never
// hold a NUL byte.
func projectListKey(tenantID, projectID string) string {
	return "project\x00" + tenantID + "\x00" + projectID
}
func userListKey(tenantID, userID string) string { return "user\x00" + tenantID + "\x00" + userID }

// ListCached reports whether ListProject (projectID set) or ListUser would
// be answered from the in-process cache.
func (s *Store) ListCached(tenantID, projectID, userID string) bool {
	key := userListKey(tenantID, userID)
	if projectID != "" {
		key = projectListKey(tenantID, projectID)
	}
	_, ok := s.lists.get(key)
	return ok
}

// list serves a list query.
func (s *Store) list(ctx context.Context, key, sql string, args ...any) ([]*Snapshot, error) {
	if s.db == nil {
		return nil, fmt.Errorf("list: %w: no database", ErrUnavailable)
	}
	rows, ok := s.lists.get(key)
	if ok {
		s.stats.cacheHits.Add(1)
	} else {
		s.stats.cacheMisses.Add(1)
		var err error
		rows, err = shared(ctx, s, &s.listFlights, key, func(ctx context.Context) ([]*Snapshot, error) {
			// As in fetch: a late flight finds the previous one's result.
			if rows, ok := s.lists.get(key); ok {
				return rows, nil
			}
			var rows []*Snapshot
			if err := s.query(ctx, sql, args, func(row *Snapshot) { rows = append(rows, row) }); err != nil {
				return nil, fmt.Errorf("list: %w: %w", ErrUnavailable, err)
			}
			s.stats.dbHits.Add(uint64(len(rows)))
			for _, row := range rows {
				s.remember(row)
			}
			s.lists.put(key, rows)
			return rows, nil
		})
		if err != nil {
			return nil, err
		}
	}
	// The cached slice is shared: fold newer versions into a copy.
	out := make([]*Snapshot, len(rows))
	for i, row := range rows {
		if cur, ok := s.tasks.get(row.TaskID); ok && cur.Version > row.Version {
			row = cur
		}
		out[i] = row
	}
	return out, nil
}
