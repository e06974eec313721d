package store_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pushd/pushd/internal/testenv"
	"github.com/pushd/pushd/snapshot"
	"github.com/pushd/pushd/snapshot/rediswrite"
	"github.com/pushd/pushd/snapshot/snapshottest"
	"github.com/pushd/pushd/snapshot/store"
)

// env is a Store on the shared Redis (own key prefix) and the package's
// PostgreSQL database.
type env struct {
	r     testenv.Redis
	pg    testenv.Postgres
	store *store.Store
}

func newEnv(t *testing.T, cfg store.Config) env {
	t.Helper()
	r := testenv.SharedRedis(t)
	pg := testenv.Database(t)
	cfg.Redis, cfg.DB, cfg.Names = r.Client, pg.Pool, r.Names
	return env{r: r, pg: pg, store: newStore(t, cfg)}
}

func newStore(t testing.TB, cfg store.Config) *store.Store {
	t.Helper()
	s := store.New(cfg)
	t.Cleanup(s.Close)
	return s
}

// insert stores a task row in PostgreSQL.
func (e env) insert(t *testing.T, id, status string, version int64) {
	t.Helper()
	e.pg.InsertTask(t, testenv.Task{ID: id, TenantID: "t1", ProjectID: "p1", UserID: "u1",
		Status: status, Progress: 10, Version: version, UpdatedAt: time.UnixMilli(1710000000000)})
}

// write stores a snapshot in Redis.
func (e env) write(t *testing.T, id, status string, version int64) {
	t.Helper()
	if _, err := rediswrite.Write(testenv.Context(t), e.r.Client, e.r.Names, snapshottest.Snapshot(t, id, "t1", status, version), 0, "", nil); err != nil {
		t.Fatal(err)
	}
}

// redisVersion returns the version Redis holds for id, 0 for none.
func (e env) redisVersion(t *testing.T, id string) int64 {
	t.Helper()
	b, err := e.r.Client.Get(testenv.Context(t), e.r.Names.Snapshot(id)).Bytes()
	if err != nil {
		return 0
	}
	return snapshottest.MustParse(t, b).Version
}

// delta returns b - a per counter, for readable assertions.
func delta(a, b store.Stats) store.Stats {
	return store.Stats{
		RedisReads: b.RedisReads - a.RedisReads, RedisHits: b.RedisHits - a.RedisHits,
		RedisMisses: b.RedisMisses - a.RedisMisses, RedisErrors: b.RedisErrors - a.RedisErrors,
		DBQueries: b.DBQueries - a.DBQueries, DBMisses: b.DBMisses - a.DBMisses,
		DBErrors: b.DBErrors - a.DBErrors, DBRejected: b.DBRejected - a.DBRejected,
		NegativeHits: b.NegativeHits - a.NegativeHits, CacheHits: b.CacheHits - a.CacheHits,
		WriteBacks: b.WriteBacks - a.WriteBacks, CacheSets: b.CacheSets - a.CacheSets,
	}
}

func mustGet(t *testing.T, s snapshot.Source, id string, atLeast int64) *snapshot.Snapshot {
	t.Helper()
	got, err := s.Get(testenv.Context(t), id, atLeast)
	if err != nil {
		t.Fatalf("Get(%s, %d): %v", id, atLeast, err)
	}
	if got.TaskID != id {
		t.Fatalf("Get(%s) returned task %s", id, got.TaskID)
	}
	return got
}

func TestStoreGetFromRedis(t *testing.T) {
	t.Parallel()
	e := newEnv(t, store.Config{})
	id := testenv.UniqueID("task")
	e.write(t, id, "RUNNING", 4)

	before := e.store.Stats()
	got := mustGet(t, e.store, id, 0)
	if got.Version != 4 || got.Origin != snapshot.OriginRedis {
		t.Fatalf("version %d from %v, want 4 from redis", got.Version, got.Origin)
	}
	d := delta(before, e.store.Stats())
	if d.RedisReads != 1 || d.RedisHits != 1 || d.DBQueries != 0 || d.CacheSets != 1 {
		t.Errorf("stats delta %+v, want one Redis read and hit, no query, the snapshot cached", d)
	}
	// Now from the in-process cache, which stores nothing more.
	mustGet(t, e.store, id, 4)
	if d := delta(before, e.store.Stats()); d.RedisReads != 1 || d.CacheHits != 1 || d.CacheSets != 1 {
		t.Errorf("stats delta %+v, want the second Get from the cache", d)
	}
}

func TestStoreFallsBackToPostgres(t *testing.T) {
	t.Parallel()
	e := newEnv(t, store.Config{})
	id := testenv.UniqueID("task")
	e.insert(t, id, "SUCCEEDED", 9)

	before := e.store.Stats()
	got := mustGet(t, e.store, id, 0)
	d := delta(before, e.store.Stats())
	if d.RedisMisses != 1 || d.DBQueries != 1 || d.WriteBacks != 1 || d.CacheSets != 1 {
		t.Errorf("stats delta %+v, want a Redis miss, a query, a write-back and the snapshot cached", d)
	}
	if got.Origin != snapshot.OriginPostgres {
		t.Errorf("origin %v, want postgres", got.Origin)
	}

	// The document has every field of the snapshot JSON of docs/DESIGN.md,
	// "Snapshot document", in order, nulls as null, updated_at in Unix ms
	// and version as a number.
	want := `{"task_id":"` + id + `","tenant_id":"t1","project_id":"p1","user_id":"u1",` +
		`"status":"SUCCEEDED","progress":10,"stage":null,"provider":null,"model":null,"queue_position":null,` +
		`"preview_asset_id":null,"output_asset_id":null,"error_code":null,"version":9,"updated_at":1710000000000}`
	if string(got.JSON()) != want {
		t.Errorf("JSON()\n got %s\nwant %s", got.JSON(), want)
	}

	// Written back with the TTL of its status.
	ctx := testenv.Context(t)
	stored, err := e.r.Client.Get(ctx, e.r.Names.Snapshot(id)).Result()
	if err != nil || stored != want {
		t.Errorf("Redis holds %q, %v; want the snapshot", stored, err)
	}
	pttl := e.r.Client.PTTL(ctx, e.r.Names.Snapshot(id)).Val()
	if base := snapshot.TTL("SUCCEEDED"); pttl < base-time.Minute || pttl > base+base/10 {
		t.Errorf("PTTL %v, want within [%v, %v]", pttl, base, base+base/10)
	}
}

func TestStoreRowWithEveryColumn(t *testing.T) {
	t.Parallel()
	e := newEnv(t, store.Config{})
	id := testenv.UniqueID("task")
	_, err := e.pg.Pool.Exec(testenv.Context(t), `INSERT INTO generation_tasks
		(id, tenant_id, project_id, user_id, status, progress, stage, provider, model, queue_position,
		 preview_asset_id, output_asset_id, error_code, version, updated_at)
		VALUES ($1, 't1', 'p1', 'u1', 'RUNNING', 45, 'provider_generating', 'veo', 'veo-3', 12,
		 'asset "1"', NULL, NULL, 18, to_timestamp(1710000000.123))`, id)
	if err != nil {
		t.Fatal(err)
	}
	got := mustGet(t, e.store, id, 0)
	want := `{"task_id":"` + id + `","tenant_id":"t1","project_id":"p1","user_id":"u1",` +
		`"status":"RUNNING","progress":45,"stage":"provider_generating","provider":"veo","model":"veo-3",` +
		`"queue_position":12,"preview_asset_id":"asset \"1\"","output_asset_id":null,"error_code":null,` +
		`"version":18,"updated_at":1710000000123}`
	if string(got.JSON()) != want {
		t.Errorf("JSON()\n got %s\nwant %s", got.JSON(), want)
	}
}

// A row that leaves every column it can to its default or NULL reads as
// the same fifteen fields, in the same order: PROTOCOL.md promises clients
// that shape. The columns that default to the empty string (project_id,
// user_id) read as "", never null or absent; progress as 0; the nullable
// ones as null.
func TestStoreRowWithDefaultsHasEveryField(t *testing.T) {
	t.Parallel()
	e := newEnv(t, store.Config{})
	id := testenv.UniqueID("task")
	_, err := e.pg.Pool.Exec(testenv.Context(t), `INSERT INTO generation_tasks (id, tenant_id, status, version, updated_at)
		VALUES ($1, 't1', 'QUEUED', 1, to_timestamp(1710000000))`, id)
	if err != nil {
		t.Fatal(err)
	}
	got := mustGet(t, e.store, id, 0)
	want := `{"task_id":"` + id + `","tenant_id":"t1","project_id":"","user_id":"",` +
		`"status":"QUEUED","progress":0,"stage":null,"provider":null,"model":null,"queue_position":null,` +
		`"preview_asset_id":null,"output_asset_id":null,"error_code":null,"version":1,"updated_at":1710000000000}`
	if string(got.JSON()) != want {
		t.Errorf("JSON()\n got %s\nwant %s", got.JSON(), want)
	}
	if got.ProjectID != "" || got.UserID != "" {
		t.Errorf("project %q, user %q: want none, as for a document without them", got.ProjectID, got.UserID)
	}
}

func TestStoreNegativeCache(t *testing.T) {
	t.Parallel()
	e := newEnv(t, store.Config{})
	ctx := testenv.Context(t)
	id := testenv.UniqueID("ghost")

	before := e.store.Stats()
	if _, err := e.store.Get(ctx, id, 0); !errors.Is(err, snapshot.ErrNotFound) {
		t.Fatalf("Get of an absent task: %v, want ErrNotFound", err)
	}
	if d := delta(before, e.store.Stats()); d.DBQueries != 1 || d.DBMisses != 1 {
		t.Fatalf("stats delta %+v, want one query and one miss", d)
	}
	pttl := e.r.Client.PTTL(ctx, e.r.Names.NotFound(id)).Val()
	if pttl < 25*time.Second || pttl > 30*time.Second {
		t.Errorf("negative-cache key PTTL %v, want about 30s", pttl)
	}

	// Again: answered in process, no query.
	mid := e.store.Stats()
	if _, err := e.store.Get(ctx, id, 0); !errors.Is(err, snapshot.ErrNotFound) {
		t.Fatalf("second Get: %v, want ErrNotFound", err)
	}
	if d := delta(mid, e.store.Stats()); d.DBQueries != 0 || d.RedisReads != 0 || d.NegativeHits != 1 {
		t.Errorf("stats delta %+v, want a negative hit and no I/O", d)
	}

	// Another node, with an empty process cache: answered by Redis.
	other := newStore(t, store.Config{Redis: e.r.Client, DB: e.pg.Pool, Names: e.r.Names})
	if _, err := other.Get(ctx, id, 0); !errors.Is(err, snapshot.ErrNotFound) {
		t.Fatalf("other node: %v, want ErrNotFound", err)
	}
	if s := other.Stats(); s.DBQueries != 0 || s.NegativeHits != 1 {
		t.Errorf("other node stats %+v, want a negative hit and no query", s)
	}

	// The task is created. Without a notification the negative cache still
	// answers; a notification's version (atLeast > 0) overrides it.
	e.insert(t, id, "QUEUED", 1)
	if _, err := e.store.Get(ctx, id, 0); !errors.Is(err, snapshot.ErrNotFound) {
		t.Fatalf("Get atLeast 0 after creation: %v, want the cached ErrNotFound", err)
	}
	for _, s := range []*store.Store{e.store, other} {
		if got := mustGet(t, s, id, 1); got.Version != 1 {
			t.Fatalf("Get atLeast 1: version %d, want 1", got.Version)
		}
		// And the task is now known without atLeast too.
		mustGet(t, s, id, 0)
	}
	if n := e.r.Client.Exists(ctx, e.r.Names.NotFound(id)).Val(); n != 0 {
		t.Error("the write-back left the negative-cache key")
	}
}

// TestStoreOneReadForABurst checks that concurrent callers share one read:
// those that arrive while it runs wait for it, those that arrive after it
// find its result in the in-process cache.
func TestStoreOneReadForABurst(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name           string
		inRedis        bool
		reads, queries uint64
	}{
		{"in redis", true, 1, 0},
		{"cold miss", false, 1, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, store.Config{CacheTTL: time.Hour}) // no entry may expire mid-test
			id := testenv.UniqueID("task")
			e.insert(t, id, "RUNNING", 3)
			if tc.inRedis {
				e.write(t, id, "RUNNING", 3)
			}
			before := e.store.Stats()
			errs := burst(200, func() error {
				got, err := e.store.Get(context.Background(), id, 0)
				if err == nil && got.Version != 3 {
					err = fmt.Errorf("version %d, want 3", got.Version)
				}
				return err
			})
			for _, err := range errs {
				t.Fatal(err)
			}
			d := delta(before, e.store.Stats())
			if d.RedisReads != tc.reads || d.DBQueries != tc.queries {
				t.Errorf("stats delta %+v, want %d Redis read(s) and %d quer(ies)", d, tc.reads, tc.queries)
			}
		})
	}
}

// A burst of Gets and GetManys of the same cold tasks reads each from
// PostgreSQL once, whichever kind of read gets there first.
func TestStoreGetAndGetManyBurstReadsEachTaskOnce(t *testing.T) {
	t.Parallel()
	// Nothing may expire, time out or be refused mid-test on a loaded machine.
	e := newEnv(t, store.Config{CacheTTL: time.Hour, FetchTimeout: time.Minute, DBQueueWait: time.Minute})
	ids := make([]string, 10)
	for i := range ids {
		ids[i] = testenv.UniqueID("task")
		e.insert(t, ids[i], "RUNNING", int64(i+1))
	}
	var n atomic.Int64
	errs := burst(200, func() error {
		i := int(n.Add(1))
		if i%2 == 0 {
			got, err := e.store.Get(context.Background(), ids[i%len(ids)], 0)
			if err == nil && got.Version != int64(i%len(ids)+1) {
				err = fmt.Errorf("%s: version %d, want %d", got.TaskID, got.Version, i%len(ids)+1)
			}
			return err
		}
		got, err := e.store.GetMany(context.Background(), ids)
		if err == nil && len(got) != len(ids) {
			err = fmt.Errorf("GetMany found %d of %d tasks", len(got), len(ids))
		}
		return err
	})
	for _, err := range errs {
		t.Fatal(err)
	}
	if st := e.store.Stats(); st.DBHits != uint64(len(ids)) || st.DBQueries > uint64(len(ids)) {
		t.Errorf("stats %+v: %d rows read in %d queries, want each of the %d tasks read once", st, st.DBHits, st.DBQueries, len(ids))
	}
}

// burst runs f in n goroutines released together, and returns the errors.
func burst(n int, f func() error) []error {
	var (
		start = make(chan struct{})
		wg    sync.WaitGroup
		mu    sync.Mutex
		errs  []error
	)
	for range n {
		wg.Go(func() {
			<-start
			if err := f(); err != nil {
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
			}
		})
	}
	close(start)
	wg.Wait()
	return errs
}

func TestStoreStaleRedisRefetchedFromPostgres(t *testing.T) {
	t.Parallel()
	e := newEnv(t, store.Config{})
	id := testenv.UniqueID("task")
	e.insert(t, id, "RUNNING", 5)
	e.write(t, id, "RUNNING", 3) // Redis lost versions 4 and 5

	if got := mustGet(t, e.store, id, 0); got.Version != 3 {
		t.Fatalf("Get atLeast 0: version %d, want Redis's 3", got.Version)
	}
	before := e.store.Stats()
	if got := mustGet(t, e.store, id, 5); got.Version != 5 {
		t.Fatalf("Get atLeast 5: version %d, want 5", got.Version)
	}
	if d := delta(before, e.store.Stats()); d.DBQueries != 1 || d.WriteBacks != 1 {
		t.Errorf("stats delta %+v, want one query and one write-back", d)
	}
	if v := e.redisVersion(t, id); v != 5 {
		t.Errorf("Redis holds version %d after the write-back, want 5", v)
	}
	// Cached now.
	mid := e.store.Stats()
	mustGet(t, e.store, id, 5)
	if d := delta(mid, e.store.Stats()); d.CacheHits != 1 || d.RedisReads != 0 {
		t.Errorf("stats delta %+v, want a cache hit", d)
	}
}

func TestStoreRedisDown(t *testing.T) {
	t.Parallel()
	srv := testenv.StartRedis(t)
	// No retries: each read fails as soon as the dial is refused.
	client := redis.NewClient(&redis.Options{Addr: srv.Addr, MaxRetries: -1, DialerRetries: 1})
	t.Cleanup(func() { client.Close() })
	pg := testenv.Database(t)
	id := testenv.UniqueID("task")
	pg.InsertTask(t, testenv.Task{ID: id, TenantID: "t1", ProjectID: "p1", UserID: "u1", Status: "RUNNING", Version: 2})

	s := newStore(t, store.Config{Redis: client, DB: pg.Pool, CacheTTL: -1})
	if got := mustGet(t, s, id, 0); got.Version != 2 {
		t.Fatalf("with Redis up: version %d", got.Version)
	}
	srv.Stop()
	before := s.Stats()
	if got := mustGet(t, s, id, 0); got.Version != 2 {
		t.Fatalf("with Redis down: version %d", got.Version)
	}
	many, err := s.GetMany(testenv.Context(t), []string{id, "absent"})
	if err != nil || len(many) != 1 || many[id] == nil {
		t.Fatalf("GetMany with Redis down = %v, %v", many, err)
	}
	// The first read found Redis down; the next skipped it.
	if d := delta(before, s.Stats()); d.RedisErrors != 1 || d.RedisReads != 1 || d.DBQueries != 2 {
		t.Errorf("stats delta %+v, want one failed Redis read and two queries", d)
	}
	if _, err := s.SetIfNewer(testenv.Context(t), snapshottest.Snapshot(t, id, "t1", "RUNNING", 3)); err == nil {
		t.Error("SetIfNewer with Redis down succeeded")
	}

	// With no PostgreSQL either, nothing answers.
	alone := newStore(t, store.Config{Redis: client})
	if _, err := alone.Get(testenv.Context(t), id, 0); !errors.Is(err, snapshot.ErrUnavailable) {
		t.Errorf("Redis down, no database: %v, want ErrUnavailable", err)
	}
	if _, err := alone.GetMany(testenv.Context(t), []string{id}); !errors.Is(err, snapshot.ErrUnavailable) {
		t.Errorf("GetMany, Redis down, no database: %v, want ErrUnavailable", err)
	}
}

func TestStoreWithoutPostgres(t *testing.T) {
	t.Parallel()
	r := testenv.SharedRedis(t)
	s := newStore(t, store.Config{Redis: r.Client, Names: r.Names})
	ctx := testenv.Context(t)
	id := testenv.UniqueID("task")
	if _, err := s.Get(ctx, id, 0); !errors.Is(err, snapshot.ErrNotFound) {
		t.Errorf("Redis miss, no database: %v, want ErrNotFound", err)
	}
	if ok, err := s.SetIfNewer(ctx, snapshottest.Snapshot(t, id, "t1", "QUEUED", 1)); err != nil || !ok {
		t.Fatalf("SetIfNewer = %v, %v", ok, err)
	}
	if got := mustGet(t, s, id, 1); got.Version != 1 {
		t.Errorf("version %d", got.Version)
	}
	if _, err := s.ListProject(ctx, "t1", "p1"); !errors.Is(err, snapshot.ErrUnavailable) {
		t.Errorf("ListProject, no database: %v, want ErrUnavailable", err)
	}
}

func TestStoreWithoutSources(t *testing.T) {
	t.Parallel()
	s := newStore(t, store.Config{})
	ctx := testenv.Context(t)
	if _, err := s.Get(ctx, "a", 0); !errors.Is(err, snapshot.ErrUnavailable) {
		t.Errorf("Get: %v, want ErrUnavailable", err)
	}
	if _, err := s.GetMany(ctx, []string{"a"}); !errors.Is(err, snapshot.ErrUnavailable) {
		t.Errorf("GetMany: %v, want ErrUnavailable", err)
	}
	if _, err := s.ListUser(ctx, "t1", "u1"); !errors.Is(err, snapshot.ErrUnavailable) {
		t.Errorf("ListUser: %v, want ErrUnavailable", err)
	}
	if _, err := s.SetIfNewer(ctx, snapshottest.Snapshot(t, "a", "t1", "QUEUED", 1)); !errors.Is(err, snapshot.ErrUnavailable) {
		t.Errorf("SetIfNewer: %v, want ErrUnavailable", err)
	}
}

func TestStoreInvalidIDsDoNoIO(t *testing.T) {
	t.Parallel()
	e := newEnv(t, store.Config{})
	ctx := testenv.Context(t)
	for _, id := range []string{"", "a b", "a{b}", "a\x00", "ü", strings.Repeat("x", snapshot.MaxIDLen+1)} {
		if _, err := e.store.Get(ctx, id, 0); !errors.Is(err, snapshot.ErrInvalidID) {
			t.Errorf("Get(%q): %v, want ErrInvalidID", id, err)
		}
		if _, err := e.store.GetMany(ctx, []string{"fine", id}); !errors.Is(err, snapshot.ErrInvalidID) {
			t.Errorf("GetMany(%q): %v, want ErrInvalidID", id, err)
		}
		if _, err := e.store.ListProject(ctx, "t1", id); !errors.Is(err, snapshot.ErrInvalidID) {
			t.Errorf("ListProject(%q): %v, want ErrInvalidID", id, err)
		}
		if _, err := e.store.ListUser(ctx, id, "u1"); !errors.Is(err, snapshot.ErrInvalidID) {
			t.Errorf("ListUser(%q): %v, want ErrInvalidID", id, err)
		}
	}
	if s := e.store.Stats(); s != (store.Stats{}) {
		t.Errorf("stats %+v after invalid ids, want no I/O", s)
	}
}

func TestStoreGetMany(t *testing.T) {
	t.Parallel()
	e := newEnv(t, store.Config{})
	ctx := testenv.Context(t)
	cached, inRedis, inPG, absent := testenv.UniqueID("cached"), testenv.UniqueID("redis"), testenv.UniqueID("pg"), testenv.UniqueID("absent")
	e.write(t, cached, "RUNNING", 1)
	mustGet(t, e.store, cached, 0)
	e.write(t, inRedis, "RUNNING", 2)
	e.insert(t, inPG, "QUEUED", 3)

	before := e.store.Stats()
	got, err := e.store.GetMany(ctx, []string{cached, inRedis, inPG, absent, cached})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 3 || got[cached].Version != 1 || got[inRedis].Version != 2 || got[inPG].Version != 3 {
		t.Fatalf("GetMany = %v, want versions 1, 2 and 3", got)
	}
	if got[inRedis].Origin != snapshot.OriginRedis || got[inPG].Origin != snapshot.OriginPostgres {
		t.Errorf("origins %v and %v, want redis (MGET) and postgres", got[inRedis].Origin, got[inPG].Origin)
	}
	d := delta(before, e.store.Stats())
	if d.CacheHits != 1 || d.RedisReads != 1 || d.DBQueries != 1 || d.DBMisses != 1 || d.WriteBacks != 1 {
		t.Errorf("stats delta %+v, want a cache hit, one MGET, one query with one miss, one write-back", d)
	}
	if v := e.redisVersion(t, inPG); v != 3 {
		t.Errorf("Redis holds version %d of the PostgreSQL task, want 3", v)
	}
	if n := e.r.Client.Exists(ctx, e.r.Names.NotFound(absent)).Val(); n != 1 {
		t.Error("no negative-cache key for the absent task")
	}

	// Everything is cached now.
	mid := e.store.Stats()
	got, err = e.store.GetMany(ctx, []string{cached, inRedis, inPG, absent})
	if err != nil || len(got) != 3 {
		t.Fatalf("second GetMany = %v, %v", got, err)
	}
	if d := delta(mid, e.store.Stats()); d.RedisReads != 0 || d.DBQueries != 0 || d.CacheHits != 3 || d.NegativeHits != 1 {
		t.Errorf("stats delta %+v, want three cache hits and a negative hit", d)
	}

	if got, err := e.store.GetMany(ctx, nil); err != nil || len(got) != 0 {
		t.Errorf("GetMany(nil) = %v, %v", got, err)
	}
	many := make([]string, snapshot.MaxMany+1)
	for i := range many {
		many[i] = fmt.Sprint("t", i)
	}
	if _, err := e.store.GetMany(ctx, many); !errors.Is(err, snapshot.ErrInvalidID) {
		t.Errorf("GetMany of %d ids: %v, want ErrInvalidID", len(many), err)
	}
	if _, err := e.store.GetMany(ctx, many[:snapshot.MaxMany]); err != nil {
		t.Errorf("GetMany of %d ids: %v", snapshot.MaxMany, err)
	}
}

func TestStoreLists(t *testing.T) {
	t.Parallel()
	e := newEnv(t, store.Config{ListCacheTTL: time.Hour})
	ctx := testenv.Context(t)
	tenant, other := testenv.UniqueID("tenant"), testenv.UniqueID("tenant")
	at := func(ms int64) time.Time { return time.UnixMilli(1710000000000 + ms) }
	for _, task := range []testenv.Task{
		{ID: testenv.UniqueID("a"), TenantID: tenant, ProjectID: "p1", UserID: "u1", Status: "RUNNING", Version: 1, UpdatedAt: at(1)},
		{ID: testenv.UniqueID("b"), TenantID: tenant, ProjectID: "p1", UserID: "u2", Status: "QUEUED", Version: 1, UpdatedAt: at(3)},
		{ID: testenv.UniqueID("c"), TenantID: tenant, ProjectID: "p2", UserID: "u1", Status: "FAILED", Version: 1, UpdatedAt: at(2)},
		{ID: testenv.UniqueID("d"), TenantID: other, ProjectID: "p1", UserID: "u1", Status: "RUNNING", Version: 1, UpdatedAt: at(4)},
	} {
		e.pg.InsertTask(t, task)
	}
	names := func(l []*snapshot.Snapshot) string {
		var s []string
		for _, x := range l {
			s = append(s, fmt.Sprintf("%s@%d", x.TaskID[:1], x.Version))
		}
		return strings.Join(s, ",")
	}

	before := e.store.Stats()
	l, err := e.store.ListProject(ctx, tenant, "p1")
	if err != nil || names(l) != "b@1,a@1" {
		t.Fatalf("ListProject = %s, %v; want b@1,a@1", names(l), err)
	}
	l, err = e.store.ListUser(ctx, tenant, "u1")
	if err != nil || names(l) != "c@1,a@1" {
		t.Fatalf("ListUser = %s, %v; want c@1,a@1", names(l), err)
	}
	if l, err := e.store.ListUser(ctx, tenant, "nobody"); err != nil || len(l) != 0 {
		t.Fatalf("ListUser of nobody = %s, %v", names(l), err)
	}
	// Cached: each listing, and each row (2 + 2 + 0).
	if d := delta(before, e.store.Stats()); d.DBQueries != 3 || d.CacheSets != 3+4 {
		t.Errorf("stats delta %+v, want three queries and seven entries cached", d)
	}

	// A newer version this node learned of is folded into the cached list.
	a := l[1]
	newer := snapshottest.MustParse(t, []byte(strings.Replace(string(a.JSON()), `"version":1`, `"version":2`, 1)))
	if ok, err := e.store.SetIfNewer(ctx, newer); err != nil || !ok {
		t.Fatalf("SetIfNewer = %v, %v", ok, err)
	}
	mid := e.store.Stats()
	if d := delta(before, mid); d.CacheSets != 3+4+1 {
		t.Errorf("stats delta %+v, want SetIfNewer's snapshot cached", d)
	}
	l, err = e.store.ListProject(ctx, tenant, "p1")
	if err != nil || names(l) != "b@1,a@2" {
		t.Fatalf("ListProject after SetIfNewer = %s, %v; want b@1,a@2", names(l), err)
	}
	if d := delta(mid, e.store.Stats()); d.DBQueries != 0 || d.CacheHits != 1 || d.CacheSets != 0 {
		t.Errorf("stats delta %+v, want the list from the cache", d)
	}
	// The listed tasks are cached for Get too.
	mustGet(t, e.store, l[0].TaskID, 1)
	if d := delta(mid, e.store.Stats()); d.RedisReads != 0 {
		t.Errorf("stats delta %+v, want Get of a listed task from the cache", d)
	}
}

func TestStoreSetIfNewer(t *testing.T) {
	t.Parallel()
	e := newEnv(t, store.Config{})
	ctx := testenv.Context(t)
	id := testenv.UniqueID("task")
	if _, err := e.store.Get(ctx, id, 0); !errors.Is(err, snapshot.ErrNotFound) {
		t.Fatalf("Get: %v, want ErrNotFound", err)
	}
	for _, step := range []struct {
		version int64
		want    bool
	}{{2, true}, {1, false}, {2, false}, {3, true}} {
		ok, err := e.store.SetIfNewer(ctx, snapshottest.Snapshot(t, id, "t1", "RUNNING", step.version))
		if err != nil || ok != step.want {
			t.Fatalf("SetIfNewer v%d = %v, %v; want %v", step.version, ok, err, step.want)
		}
	}
	// The write cleared the negative cache and filled the process cache.
	before := e.store.Stats()
	if got := mustGet(t, e.store, id, 0); got.Version != 3 {
		t.Errorf("Get: version %d, want 3", got.Version)
	}
	if d := delta(before, e.store.Stats()); d.CacheHits != 1 || d.RedisReads != 0 {
		t.Errorf("stats delta %+v, want a cache hit", d)
	}
	if v := e.redisVersion(t, id); v != 3 {
		t.Errorf("Redis holds version %d, want 3", v)
	}
	pttl := e.r.Client.PTTL(ctx, e.r.Names.Snapshot(id)).Val()
	if base := snapshot.TTL("RUNNING"); pttl < base-time.Second || pttl > base+base/10 {
		t.Errorf("PTTL %v, want within [%v, %v]", pttl, base, base+base/10)
	}
	if _, err := e.store.SetIfNewer(ctx, nil); err == nil {
		t.Error("SetIfNewer(nil) succeeded")
	}
}

func TestStoreClose(t *testing.T) {
	t.Parallel()
	e := newEnv(t, store.Config{})
	id := testenv.UniqueID("task")
	e.write(t, id, "RUNNING", 1)
	e.store.Close()
	e.store.Close()
	if _, err := e.store.Get(testenv.Context(t), id, 0); !errors.Is(err, snapshot.ErrUnavailable) {
		t.Errorf("Get after Close: %v, want ErrUnavailable", err)
	}
}

// The Store holds the snapshot JSON verbatim when Redis has fields
// PostgreSQL does not.
func TestStoreForwardsUnknownFieldsFromRedis(t *testing.T) {
	t.Parallel()
	e := newEnv(t, store.Config{})
	id := testenv.UniqueID("task")
	in := `{"task_id":"` + id + `","tenant_id":"t1","version":1,"eta_ms":1200}`
	if _, err := rediswrite.Write(testenv.Context(t), e.r.Client, e.r.Names, snapshottest.MustParse(t, []byte(in)), 0, "", nil); err != nil {
		t.Fatal(err)
	}
	got := mustGet(t, e.store, id, 0)
	var m map[string]any
	if err := json.Unmarshal(got.JSON(), &m); err != nil || m["eta_ms"] != 1200.0 {
		t.Errorf("JSON() = %s, want eta_ms kept", got.JSON())
	}
}

// A row pushd cannot represent is skipped (and logged), not fatal to a list.
func TestStoreSkipsUnrepresentableRows(t *testing.T) {
	t.Parallel()
	e := newEnv(t, store.Config{Logger: slog.New(slog.DiscardHandler)})
	tenant := testenv.UniqueID("tenant")
	good, bad := testenv.UniqueID("good"), testenv.UniqueID("bad")
	e.pg.InsertTask(t, testenv.Task{ID: good, TenantID: tenant, ProjectID: "p1", UserID: "u1", Status: "RUNNING", Version: 1})
	e.pg.InsertTask(t, testenv.Task{ID: bad, TenantID: tenant, ProjectID: "p1", UserID: "user {1}", Status: "RUNNING", Version: 1})

	l, err := e.store.ListProject(testenv.Context(t), tenant, "p1")
	if err != nil || len(l) != 1 || l[0].TaskID != good {
		t.Fatalf("ListProject = %v, %v; want only the good task", l, err)
	}
	if _, err := e.store.Get(testenv.Context(t), bad, 0); !errors.Is(err, snapshot.ErrNotFound) {
		t.Fatalf("Get of the bad row: %v, want ErrNotFound", err)
	}
}
