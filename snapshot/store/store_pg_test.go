package store_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pushd/pushd/internal/testenv"
	"github.com/pushd/pushd/snapshot"
	"github.com/pushd/pushd/snapshot/store"
)

// The tests in this file lock generation_tasks, so they do not run in
// parallel: Go runs them before any parallel test of the package resumes.

func TestStoreStatementTimeout(t *testing.T) {
	pg := testenv.Database(t)
	// The fetch may take a minute; only the server-side statement timeout
	// can end the query sooner.
	s := newStore(t, store.Config{DB: pg.Pool, StatementTimeout: 100 * time.Millisecond, FetchTimeout: time.Minute})
	pg.LockTasks(t)

	_, err := s.Get(testenv.Context(t), testenv.UniqueID("task"), 0)
	if !errors.Is(err, snapshot.ErrUnavailable) {
		t.Fatalf("Get on a locked table: %v, want ErrUnavailable", err)
	}
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "57014" { // query_canceled
		t.Fatalf("Get on a locked table: %v, want PostgreSQL's statement timeout", err)
	}
	if st := s.Stats(); st.DBQueries != 1 || st.DBErrors != 1 {
		t.Errorf("stats %+v, want one failed query", st)
	}
}

func TestStoreDBQueryCap(t *testing.T) {
	pg := testenv.Database(t)
	s := newStore(t, store.Config{DB: pg.Pool, MaxDBQueries: 1, StatementTimeout: time.Minute, FetchTimeout: time.Minute})
	id := testenv.UniqueID("task")
	pg.InsertTask(t, testenv.Task{ID: id, TenantID: "t1", Status: "RUNNING", Version: 1})
	unlock := pg.LockTasks(t)

	// One Get takes the only slot and waits on the lock.
	type result struct {
		snap *snapshot.Snapshot
		err  error
	}
	first := make(chan result, 1)
	go func() {
		snap, err := s.Get(context.Background(), id, 0)
		first <- result{snap, err}
	}()
	testenv.Eventually(t, "the first query", func() bool { return s.Stats().DBQueries == 1 })

	// Another read waits for a slot while its context lasts, then gives up
	// without querying.
	ctx, cancel := context.WithTimeout(testenv.Context(t), 100*time.Millisecond)
	defer cancel()
	_, err := s.GetMany(ctx, []string{testenv.UniqueID("other")})
	if !errors.Is(err, snapshot.ErrUnavailable) {
		t.Fatalf("GetMany with the cap hit: %v, want ErrUnavailable", err)
	}
	if st := s.Stats(); st.DBQueries != 1 || st.DBRejected != 1 {
		t.Errorf("stats %+v, want one query and one rejected", st)
	}

	unlock()
	if r := <-first; r.err != nil || r.snap.Version != 1 {
		t.Fatalf("first Get = %v, %v", r.snap, r.err)
	}
}

// A caller that gives up does not fail the fetch it shared with others.
func TestStoreCallerCancelDoesNotFailSharedFetch(t *testing.T) {
	pg := testenv.Database(t)
	s := newStore(t, store.Config{DB: pg.Pool, StatementTimeout: time.Minute, FetchTimeout: time.Minute})
	id := testenv.UniqueID("task")
	pg.InsertTask(t, testenv.Task{ID: id, TenantID: "t1", Status: "RUNNING", Version: 4})
	unlock := pg.LockTasks(t)

	ctx, cancel := context.WithCancel(testenv.Context(t))
	gaveUp := make(chan error, 1)
	go func() {
		_, err := s.Get(ctx, id, 0)
		gaveUp <- err
	}()
	testenv.Eventually(t, "the shared query", func() bool { return s.Stats().DBQueries == 1 })
	cancel()
	if err := <-gaveUp; !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled Get: %v, want context.Canceled", err)
	}

	// The query goes on. Had it been cancelled with the first caller, this
	// Get would start a second one.
	unlock()
	if got := mustGet(t, s, id, 0); got.Version != 4 {
		t.Fatalf("version %d, want 4", got.Version)
	}
	if st := s.Stats(); st.DBQueries != 1 || st.DBErrors != 0 {
		t.Errorf("stats %+v, want the one shared query, successful", st)
	}
}

// A task is read from PostgreSQL once while a read of it is running,
// whether the reads are Gets or GetMany batches; a Reload does not share a
// read sent before it, which could miss a change it is looking for.
func TestStoreGetAndGetManyShareAQuery(t *testing.T) {
	e := newEnv(t, store.Config{StatementTimeout: time.Minute, FetchTimeout: time.Minute, DBQueueWait: time.Minute, CacheTTL: time.Hour})
	a, b := testenv.UniqueID("task"), testenv.UniqueID("task")
	e.insert(t, a, "RUNNING", 1)
	e.insert(t, b, "RUNNING", 2)
	unlock := e.pg.LockTasks(t)

	type result struct {
		got map[string]*snapshot.Snapshot
		err error
	}
	results := make(chan result, 3)
	go func() {
		snap, err := e.store.Get(context.Background(), a, 0)
		results <- result{map[string]*snapshot.Snapshot{a: snap}, err}
	}()
	testenv.Eventually(t, "the Get's query", func() bool { return e.store.Stats().DBQueries == 1 })
	go func() {
		got, err := e.store.GetMany(context.Background(), []string{a, b})
		results <- result{got, err}
	}()
	testenv.Eventually(t, "the GetMany's query", func() bool { return e.store.Stats().DBQueries == 2 })
	go func() {
		got, err := e.store.Reload(context.Background(), []string{a})
		results <- result{got, err}
	}()
	testenv.Eventually(t, "the Reload's query", func() bool { return e.store.Stats().DBQueries == 3 })

	unlock()
	for range 3 {
		r := <-results
		if r.err != nil {
			t.Fatal(r.err)
		}
		if r.got[a] == nil || r.got[a].Version != 1 || (r.got[b] != nil && r.got[b].Version != 2) {
			t.Fatalf("read %v, want version 1 of %s (and 2 of %s)", r.got, a, b)
		}
	}
	// Without sharing the GetMany reads a again: four rows.
	if st := e.store.Stats(); st.DBQueries != 3 || st.DBHits != 3 || st.WriteBacks != 2 {
		t.Errorf("stats %+v, want 3 queries returning 3 rows (a by the Get, b by the GetMany, a by the Reload) and 2 write-backs", st)
	}
}

// A Reload shares a read registered before it whose query still waits for
// a PostgreSQL slot: sent later, it cannot miss a change made before the
// Reload. In a storm (the initial Gets queued for the 8 slots) the re-read
// of a tenant after its bus subscription came back read those tasks twice.
func TestStoreReloadSharesAQueryNotYetSent(t *testing.T) {
	e := newEnv(t, store.Config{MaxDBQueries: 1, StatementTimeout: time.Minute, FetchTimeout: time.Minute, DBQueueWait: time.Minute, CacheTTL: time.Hour})
	a, other := testenv.UniqueID("task"), testenv.UniqueID("task")
	e.insert(t, a, "RUNNING", 1)
	e.insert(t, other, "RUNNING", 1)
	registered := make(chan struct{}, 3)
	store.OnDBReadRegistered(e.store, func() { registered <- struct{}{} })
	unlock := e.pg.LockTasks(t)

	type result struct {
		snap *snapshot.Snapshot
		err  error
	}
	results := make(chan result, 3)
	get := func(id string) {
		snap, err := e.store.Get(context.Background(), id, 0)
		results <- result{snap, err}
	}
	// The only slot: a query blocked on the lock.
	go get(other)
	<-registered
	testenv.Eventually(t, "the first query", func() bool { return e.store.Stats().DBQueries == 1 })
	// a's read is registered and waits for the slot.
	go get(a)
	<-registered
	go func() {
		got, err := e.store.Reload(context.Background(), []string{a})
		results <- result{got[a], err}
	}()
	<-registered // joined a's read, or registered one of its own

	unlock()
	for range 3 {
		r := <-results
		if r.err != nil {
			t.Fatal(r.err)
		}
		if r.snap == nil || r.snap.Version != 1 {
			t.Fatalf("read %v, want version 1", r.snap)
		}
	}
	if st := e.store.Stats(); st.DBQueries != 2 || st.DBHits != 2 {
		t.Errorf("stats %+v, want 2 queries returning 2 rows: a read once, shared by the Get and the Reload", st)
	}
}

// A batch read whose caller leaves (a client that hung up) still finishes
// the PostgreSQL query others wait on: their reads neither fail nor query
// again.
func TestStoreSharedQueryOutlivesItsCaller(t *testing.T) {
	e := newEnv(t, store.Config{StatementTimeout: time.Minute, FetchTimeout: time.Minute, DBQueueWait: time.Minute, CacheTTL: time.Hour})
	a := testenv.UniqueID("task")
	e.insert(t, a, "RUNNING", 1)
	unlock := e.pg.LockTasks(t)

	ctx, cancel := context.WithCancel(context.Background())
	left := make(chan error, 1)
	go func() {
		_, err := e.store.GetMany(ctx, []string{a})
		left <- err
	}()
	testenv.Eventually(t, "the batch's query", func() bool { return e.store.Stats().DBQueries == 1 })
	cancel() // its caller is gone; the query is still registered
	got := make(chan error, 1)
	go func() {
		snap, err := e.store.Get(context.Background(), a, 0)
		if err == nil && snap.Version != 1 {
			err = fmt.Errorf("version %d, want 1", snap.Version)
		}
		got <- err
	}()
	unlock()
	if err := <-got; err != nil {
		t.Fatalf("the Get that shared a departed caller's query: %v", err)
	}
	<-left
	if st := e.store.Stats(); st.DBQueries != 1 {
		t.Fatalf("%d PostgreSQL queries, want the departed caller's one, shared", st.DBQueries)
	}
}

// A herd of callers' reads (new connections' initial states, which can
// give up) holds at most half of the PostgreSQL slots: the hub's read for
// notifications, whose context never ends, finds one free and is sent at
// once, not after the herd's.
func TestDeliveryReadsDoNotQueueBehindCallers(t *testing.T) {
	pg := testenv.Database(t)
	s := newStore(t, store.Config{DB: pg.Pool, MaxDBQueries: 2, DBQueueWait: time.Minute, StatementTimeout: time.Minute, FetchTimeout: time.Minute})
	ids := make([]string, 6)
	for i := range ids {
		ids[i] = testenv.UniqueID("task")
		pg.InsertTask(t, testenv.Task{ID: ids[i], TenantID: "t1", Status: "RUNNING", Version: 1})
	}
	unlock := pg.LockTasks(t)
	ctx := testenv.Context(t)
	var wg sync.WaitGroup
	callers := make(chan error, 4)
	for _, id := range ids[:4] {
		wg.Go(func() {
			_, err := s.Get(ctx, id, 0)
			callers <- err
		})
	}
	testenv.Eventually(t, "a caller's query sent", func() bool { return s.Stats().DBQueries >= 1 })
	delivered := make(chan error, 1)
	wg.Go(func() {
		_, err := s.GetMany(context.Background(), ids[4:])
		delivered <- err
	})
	// The callers hold at most one slot, so a second query waiting on the
	// lock is the delivery's. (Not told apart by its shape: the callers
	// that came while the first caller's read waited for its slot joined
	// it, which then asks for several ids too.)
	testenv.Eventually(t, "the delivery's query sent beside the callers'", func() bool {
		var n int
		pg.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE '%FROM generation_tasks%'`).Scan(&n)
		return n == 2
	})
	if n := s.Stats().DBQueries; n != 2 {
		t.Errorf("%d queries sent, want 2: one caller's, the delivery's", n)
	}
	unlock()
	wg.Wait()
	close(callers)
	for err := range callers {
		if err != nil {
			t.Errorf("caller's Get: %v", err)
		}
	}
	if err := <-delivered; err != nil {
		t.Errorf("delivery's GetMany: %v", err)
	}
}

// TestCallersReadsShareAQuery: callers' reads of different tasks that
// queue for a PostgreSQL slot join the query of the first of them still
// waiting, so a herd of new connections costs a few queries, not one a
// task; each read still answers its own task.
func TestCallersReadsShareAQuery(t *testing.T) {
	pg := testenv.Database(t)
	// One slot for callers: the first read takes it, the rest queue.
	s := newStore(t, store.Config{DB: pg.Pool, MaxDBQueries: 2, DBQueueWait: time.Minute, StatementTimeout: time.Minute, FetchTimeout: time.Minute})
	const herd = 20
	ids := make([]string, herd)
	for i := range ids {
		ids[i] = testenv.UniqueID("task")
		pg.InsertTask(t, testenv.Task{ID: ids[i], TenantID: "t1", Status: "RUNNING", Version: int64(i + 1)})
	}
	var registered atomic.Int64
	store.OnDBReadRegistered(s, func() { registered.Add(1) })
	unlock := pg.LockTasks(t)
	ctx := testenv.Context(t)
	var wg sync.WaitGroup
	errs := make(chan error, herd)
	for i, id := range ids {
		wg.Go(func() {
			snap, err := s.Get(ctx, id, 0)
			if err == nil && (snap.TaskID != id || snap.Version != int64(i+1)) {
				err = fmt.Errorf("Get %s: task %s version %d, want version %d", id, snap.TaskID, snap.Version, i+1)
			}
			errs <- err
		})
	}
	testenv.Eventually(t, "every read registered", func() bool { return registered.Load() == herd })
	unlock()
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
	if n := s.Stats().DBQueries; n != 2 {
		t.Errorf("%d reads of as many tasks sent %d queries, want 2: the first, and one for the others", herd, n)
	}
	// What the shared query read is cached for every task it held.
	for _, id := range ids {
		if s.Cached(id) == nil {
			t.Errorf("%s not cached after the shared query", id)
		}
	}
}
