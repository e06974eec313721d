package converge_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/pushd/pushd/converge"
	"github.com/pushd/pushd/internal/testenv"
	"github.com/pushd/pushd/snapshot"
	"github.com/pushd/pushd/snapshot/rediswrite"
	"github.com/pushd/pushd/snapshot/snapshottest"
	"github.com/pushd/pushd/snapshot/store"
)

// checkNode is a node's store with the repair's checks over it.
type checkNode struct {
	store    *store.Store
	repairer *converge.Repairer
}

func (n checkNode) check(ctx context.Context, req converge.CheckRequest) (converge.Checked, error) {
	return converge.Check(ctx, n.repairer, req)
}

func (n checkNode) checkScopes(ctx context.Context, req converge.ScopeCheckRequest) (converge.ScopesChecked, error) {
	return converge.CheckScopes(ctx, n.repairer, req)
}

func (n checkNode) stats() converge.RepairStats { return n.repairer.Stats() }

// checkEnv is a test's Redis prefix and the package's database, with one
// node on them; node adds more.
type checkEnv struct {
	r  testenv.Redis
	pg testenv.Postgres
	checkNode
}

func newCheckEnv(t *testing.T, cfg store.Config) checkEnv {
	t.Helper()
	e := checkEnv{r: testenv.SharedRedis(t), pg: testenv.Database(t)}
	e.checkNode = e.node(t, cfg)
	return e
}

// node is another node on e's Redis and database: its store, made with
// cfg, and its checks.
func (e checkEnv) node(t *testing.T, cfg store.Config) checkNode {
	t.Helper()
	cfg.Redis, cfg.DB, cfg.Names = e.r.Client, e.pg.Pool, e.r.Names
	s := store.New(cfg)
	t.Cleanup(s.Close)
	return checkNode{store: s, repairer: converge.NewRepairer(converge.RepairConfig{Store: s, Redis: e.r.Client, Names: e.r.Names})}
}

// insert stores a task row in PostgreSQL, committed long ago.
func (e checkEnv) insert(t *testing.T, id, status string, version int64) {
	t.Helper()
	e.pg.InsertTask(t, testenv.Task{ID: id, TenantID: "t1", ProjectID: "p1", UserID: "u1",
		Status: status, Progress: 10, Version: version, UpdatedAt: time.UnixMilli(1710000000000)})
}

// write stores a snapshot in Redis.
func (e checkEnv) write(t *testing.T, id, status string, version int64) {
	t.Helper()
	if _, err := rediswrite.Write(testenv.Context(t), e.r.Client, e.r.Names, snapshottest.Snapshot(t, id, "t1", status, version), 0, "", nil); err != nil {
		t.Fatal(err)
	}
}

// redisVersion returns the version Redis holds for id, 0 for none.
func (e checkEnv) redisVersion(t *testing.T, id string) int64 {
	t.Helper()
	b, err := e.r.Client.Get(testenv.Context(t), e.r.Names.Snapshot(id)).Bytes()
	if err != nil {
		return 0
	}
	return snapshottest.MustParse(t, b).Version
}

// noPublish fails the test if a check publishes.
func noPublish(t *testing.T) func(context.Context, *snapshot.Snapshot) error {
	return func(_ context.Context, s *snapshot.Snapshot) error {
		t.Errorf("published %s v%d, want nothing published", s.TaskID, s.Version)
		return nil
	}
}

// expireClaim makes the task's last claim as old as can be, as if its
// hold had passed.
func (e checkEnv) expireClaim(t *testing.T, id string) {
	t.Helper()
	if err := e.r.Client.HSet(testenv.Context(t), e.r.Names.Checked(id), "at", 0).Err(); err != nil {
		t.Fatal(err)
	}
}

// Two nodes checking the same task within a hold: the first claims it and
// reads PostgreSQL, the second reads Redis only.
func TestCheckClaimsEachTaskOncePerHold(t *testing.T) {
	e := newCheckEnv(t, store.Config{})
	other := e.node(t, store.Config{})
	id := testenv.UniqueID("task")
	e.insert(t, id, "RUNNING", 1)
	e.write(t, id, "RUNNING", 1)
	ctx := testenv.Context(t)
	req := converge.CheckRequest{IDs: []string{id}, Hold: time.Hour, Publish: noPublish(t)}
	for _, s := range []checkNode{e.checkNode, other} {
		res, err := s.check(ctx, req)
		if err != nil || res.Found[id] == nil || res.Found[id].Version != 1 || len(res.Repaired) != 0 {
			t.Fatalf("Check = %+v, %v; want v1 found in Redis, nothing repaired", res, err)
		}
	}
	if a, b := e.stats(), other.stats(); a.Checked != 1 || a.CheckQueries != 1 || a.CheckRows != 1 || b.Checked != 0 || b.CheckQueries != 0 {
		t.Fatalf("checked %d (%d queries, %d rows) and %d (%d queries), want the first node alone to check", a.Checked, a.CheckQueries, a.CheckRows, b.Checked, b.CheckQueries)
	}
	if v := e.r.Client.HGet(ctx, e.r.Names.Checked(id), "v").Val(); v != "1" {
		t.Fatalf("the marker records v%q, want 1", v)
	}
}

// A claim sets the marker's TTL when half of it has passed since it was
// last set, not on every claim: a watched task's marker lives on, and a
// round costs no PEXPIRE per task.
func TestCheckSetsTheMarkersTTLOncePerHalfOfIt(t *testing.T) {
	e := newCheckEnv(t, store.Config{})
	id := testenv.UniqueID("task")
	e.insert(t, id, "RUNNING", 1)
	e.write(t, id, "RUNNING", 1)
	ctx := testenv.Context(t)
	key := e.r.Names.Checked(id)
	req := converge.CheckRequest{IDs: []string{id}, Hold: time.Hour, Publish: noPublish(t)}
	if _, err := e.check(ctx, req); err != nil {
		t.Fatal(err)
	}
	if ttl := e.r.Client.PTTL(ctx, key).Val(); ttl <= 59*time.Minute {
		t.Fatalf("the first claim left the marker a TTL of %v, want an hour", ttl)
	}
	// A claim within half the TTL of the last setting leaves it alone.
	e.r.Client.PExpire(ctx, key, 10*time.Minute)
	e.expireClaim(t, id)
	if _, err := e.check(ctx, req); err != nil {
		t.Fatal(err)
	}
	if ttl := e.r.Client.PTTL(ctx, key).Val(); ttl > 10*time.Minute || ttl <= 0 {
		t.Fatalf("a second claim moved the marker's TTL to %v, want it left at most 10m", ttl)
	}
	// Past half of it, the next claim sets it again.
	if err := e.r.Client.HSet(ctx, key, "x", 0).Err(); err != nil {
		t.Fatal(err)
	}
	e.expireClaim(t, id)
	if _, err := e.check(ctx, req); err != nil {
		t.Fatal(err)
	}
	if ttl := e.r.Client.PTTL(ctx, key).Val(); ttl <= 59*time.Minute {
		t.Fatalf("a claim past half the TTL left the marker %v, want an hour", ttl)
	}
}

// A version only PostgreSQL holds is published once its row is half a
// second old, and once only: not again after Redis lost its snapshot,
// since the marker recorded it.
func TestCheckPublishesWhatOnlyPostgresHolds(t *testing.T) {
	e := newCheckEnv(t, store.Config{})
	id := testenv.UniqueID("task")
	e.insert(t, id, "RUNNING", 1)
	e.write(t, id, "RUNNING", 1)
	ctx := testenv.Context(t)
	var published []*snapshot.Snapshot
	req := converge.CheckRequest{IDs: []string{id}, Hold: time.Hour, Publish: func(ctx context.Context, s *snapshot.Snapshot) error {
		published = append(published, s)
		_, err := rediswrite.Write(ctx, e.r.Client, e.r.Names, s, time.Minute, "", nil)
		return err
	}}
	if _, err := e.check(ctx, req); err != nil || len(published) != 0 {
		t.Fatalf("first check: %v, published %d", err, len(published))
	}
	// Committed a moment ago: the writer may be storing it in Redis now.
	e.pg.InsertTask(t, testenv.Task{ID: id, TenantID: "t1", ProjectID: "p1", UserID: "u1", Status: "SUCCEEDED", Version: 2, UpdatedAt: time.Now()})
	e.expireClaim(t, id)
	if res, err := e.check(ctx, req); err != nil || len(res.Repaired) != 0 || len(published) != 0 {
		t.Fatalf("a version committed now: %+v, %v, published %d; want it left to its writer", res, err, len(published))
	}
	e.insert(t, id, "SUCCEEDED", 2) // committed long ago; the writer died before Redis
	e.expireClaim(t, id)
	res, err := e.check(ctx, req)
	if err != nil || len(res.Repaired) != 1 || res.Repaired[0].Version != 2 || res.Found[id].Version != 2 {
		t.Fatalf("Check = %+v, %v; want v2 repaired and found", res, err)
	}
	if len(published) != 1 || e.redisVersion(t, id) != 2 || e.stats().Repaired != 1 {
		t.Fatalf("published %d, Redis holds v%d, %d repaired; want v2 published once", len(published), e.redisVersion(t, id), e.stats().Repaired)
	}
	// Redis expires the snapshot; the version was checked already.
	if err := e.r.Client.Del(ctx, e.r.Names.Snapshot(id)).Err(); err != nil {
		t.Fatal(err)
	}
	e.expireClaim(t, id)
	if res, err := e.check(ctx, req); err != nil || len(res.Repaired) != 0 || len(published) != 1 {
		t.Fatalf("after Redis lost it: %+v, %v, published %d; want nothing repaired again", res, err, len(published))
	}
}

// A task last found finished is left out of the PostgreSQL part unless
// the round asks for finished tasks.
func TestCheckLeavesFinishedTasksToFullRounds(t *testing.T) {
	e := newCheckEnv(t, store.Config{})
	id := testenv.UniqueID("task")
	e.insert(t, id, "SUCCEEDED", 1)
	e.write(t, id, "SUCCEEDED", 1)
	ctx := testenv.Context(t)
	check := func(finished bool) uint64 {
		t.Helper()
		e.expireClaim(t, id)
		if _, err := e.check(ctx, converge.CheckRequest{IDs: []string{id}, Hold: time.Hour, Finished: finished, Publish: noPublish(t)}); err != nil {
			t.Fatal(err)
		}
		return e.stats().Checked
	}
	if n := check(false); n != 1 {
		t.Fatalf("checked %d, want the task checked once before it is known finished", n)
	}
	if n := check(false); n != 1 {
		t.Fatalf("checked %d, want the finished task left out", n)
	}
	if n := check(true); n != 2 {
		t.Fatalf("checked %d, want the finished task checked in a round that asks", n)
	}
}

// While half of the PostgreSQL slots are busy, a check reads Redis only
// and says it skipped the rest.
func TestCheckYieldsBusyPostgresSlots(t *testing.T) {
	e := newCheckEnv(t, store.Config{MaxDBQueries: 2, FetchTimeout: time.Minute})
	busy, id := testenv.UniqueID("busy"), testenv.UniqueID("task")
	e.insert(t, busy, "RUNNING", 1)
	e.insert(t, id, "RUNNING", 1)
	e.write(t, id, "RUNNING", 1)
	unlock := e.pg.LockTasks(t)
	done := make(chan error, 1)
	go func() { _, err := e.store.Get(context.Background(), busy, 0); done <- err }()
	testenv.Eventually(t, "a read holding a slot", func() bool { return e.store.Stats().DBQueries == 1 })
	res, err := e.check(testenv.Context(t), converge.CheckRequest{IDs: []string{id}, Hold: time.Hour, Publish: noPublish(t)})
	if err != nil || !res.Skipped || res.Found[id] == nil || e.stats().Checked != 0 {
		t.Fatalf("Check = %+v, %v, checked %d; want Redis's v1, the PostgreSQL part skipped", res, err, e.stats().Checked)
	}
	unlock()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// A check whose PostgreSQL part takes longer than SlowCheck says so, and
// the rounds wait longer before the next.
func TestCheckReportsSlowPostgres(t *testing.T) {
	e := newCheckEnv(t, store.Config{FetchTimeout: time.Minute, StatementTimeout: time.Minute})
	id := testenv.UniqueID("task")
	e.insert(t, id, "RUNNING", 1)
	e.write(t, id, "RUNNING", 1)
	ctx := testenv.Context(t)
	req := converge.CheckRequest{IDs: []string{id}, Hold: time.Hour, Publish: noPublish(t)}
	if res, err := e.check(ctx, req); err != nil || res.Slow {
		t.Fatalf("Check = %+v, %v; want it quick", res, err)
	}
	e.expireClaim(t, id)
	unlock := e.pg.LockTasks(t)
	done := make(chan converge.Checked, 1)
	go func() { res, _ := e.check(ctx, req); done <- res }()
	testenv.Eventually(t, "the versions query blocked on the lock", func() bool {
		var n int
		e.pg.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE '%version, status%'`).Scan(&n)
		return n == 1
	})
	// The stimulus: PostgreSQL stays slow past SlowCheck.
	time.Sleep(converge.SlowCheck + 100*time.Millisecond)
	unlock()
	if res := <-done; !res.Slow || res.Skipped {
		t.Fatalf("Check = %+v after a blocked query; want it slow, not skipped", res)
	}
}

// A task never checked whose snapshot Redis lacks (a cold Redis, a
// reconnect storm reading it back) is recorded, not published: nothing
// says anyone holds an older version. Checked once, a version that Redis
// then lacks is published when PostgreSQL moves past it.
func TestCheckRecordsWhatRedisLacksOnTheFirstCheck(t *testing.T) {
	e := newCheckEnv(t, store.Config{})
	id := testenv.UniqueID("task")
	e.insert(t, id, "RUNNING", 3)
	ctx := testenv.Context(t)
	var published []*snapshot.Snapshot
	req := converge.CheckRequest{IDs: []string{id}, Hold: time.Hour, Publish: func(_ context.Context, s *snapshot.Snapshot) error {
		published = append(published, s)
		return nil
	}}
	if res, err := e.check(ctx, req); err != nil || len(res.Repaired) != 0 || len(published) != 0 {
		t.Fatalf("first check of a task Redis lacks: %+v, %v, published %d; want it recorded only", res, err, len(published))
	}
	if v := e.r.Client.HGet(ctx, e.r.Names.Checked(id), "v").Val(); v != "3" {
		t.Fatalf("the marker records v%q, want 3", v)
	}
	e.insert(t, id, "FAILED", 4)
	e.expireClaim(t, id)
	if res, err := e.check(ctx, req); err != nil || len(res.Repaired) != 1 || len(published) != 1 || published[0].Version != 4 {
		t.Fatalf("after the change: %+v, %v, published %d; want v4 published", res, err, len(published))
	}
}

// A round that finds many changes never announced publishes them side by
// side: each publish here waits until another is in flight too, which
// publishes made one after another never see before the check's deadline.
func TestCheckPublishesRepairsSideBySide(t *testing.T) {
	e := newCheckEnv(t, store.Config{})
	ctx := testenv.Context(t)
	ids := make([]string, 20)
	for i := range ids {
		ids[i] = testenv.UniqueID("task")
		e.write(t, ids[i], "RUNNING", 1)
		e.insert(t, ids[i], "RUNNING", 2) // committed long ago; its writer died before Redis
	}
	var mu sync.Mutex
	inFlight, together := 0, make(chan struct{})
	req := converge.CheckRequest{IDs: ids, Hold: time.Hour, Publish: func(ctx context.Context, s *snapshot.Snapshot) error {
		mu.Lock()
		if inFlight++; inFlight == 2 {
			close(together)
		}
		mu.Unlock()
		select {
		case <-together:
		case <-ctx.Done():
			return ctx.Err()
		}
		_, err := rediswrite.Write(ctx, e.r.Client, e.r.Names, s, time.Minute, "", nil)
		return err
	}}
	res, err := e.check(ctx, req)
	if err != nil || len(res.Repaired) != len(ids) {
		t.Fatalf("Check repaired %d of %d, %v; want every one", len(res.Repaired), len(ids), err)
	}
	for _, id := range ids {
		if v := e.redisVersion(t, id); v != 2 {
			t.Errorf("%s: Redis holds v%d, want v2", id, v)
		}
	}
}
