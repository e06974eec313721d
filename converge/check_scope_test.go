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
	"github.com/pushd/pushd/snapshot/store"
)

// scopeRecorder is a CheckScopes's Publish and Announce: it records what
// they were given, and Publish stores it as the node's publisher would.
type scopeRecorder struct {
	e                    checkEnv
	mu                   sync.Mutex // Publish is called from several goroutines
	published, announced map[string]int64
}

func newScopeRecorder(e checkEnv) *scopeRecorder {
	return &scopeRecorder{e: e, published: map[string]int64{}, announced: map[string]int64{}}
}

func (r *scopeRecorder) request(scopes ...snapshot.Scope) converge.ScopeCheckRequest {
	return converge.ScopeCheckRequest{
		Scopes: scopes, Hold: time.Hour, LookBack: time.Minute,
		Publish: func(ctx context.Context, s *snapshot.Snapshot) error {
			r.mu.Lock()
			r.published[s.TaskID] = s.Version
			r.mu.Unlock()
			_, err := rediswrite.Write(ctx, r.e.r.Client, r.e.r.Names, s, time.Minute, "", nil)
			return err
		},
		Announce: func(_ context.Context, s *snapshot.Snapshot) error {
			r.announced[s.TaskID] = s.Version
			return nil
		},
	}
}

// expireScopeClaim makes the scope's last claim as old as can be.
func (e checkEnv) expireScopeClaim(t *testing.T, kind, tenant, id string) {
	t.Helper()
	if err := e.r.Client.HSet(testenv.Context(t), e.r.Names.ScopeChecked(tenant, kind, id), "at", 0).Err(); err != nil {
		t.Fatal(err)
	}
}

// A task created in a watched project and never announced is found by the
// project's listing, which one node of two lists per hold: one whose row
// alone exists is published, one Redis holds too is announced, each once;
// a row committed a moment ago is left to its writer until it is half a
// second old, and a change older than the listing's reach is not listed.
func TestCheckScopesFindsTasksNeverAnnounced(t *testing.T) {
	e := newCheckEnv(t, store.Config{})
	other := e.node(t, store.Config{})
	project := testenv.UniqueID("p")
	dbOnly, stored, young, old := testenv.UniqueID("dbonly"), testenv.UniqueID("stored"), testenv.UniqueID("young"), testenv.UniqueID("old")
	ago := time.Now().Add(-2 * time.Second)
	row := func(id string, at time.Time) {
		e.pg.InsertTask(t, testenv.Task{ID: id, TenantID: "t1", ProjectID: project, UserID: "u1", Status: "RUNNING", Progress: 10, Version: 1, UpdatedAt: at})
	}
	row(dbOnly, ago)
	row(stored, ago)
	e.write(t, stored, "RUNNING", 1)
	row(young, time.Now())
	row(old, time.Now().Add(-time.Hour))
	ctx := testenv.Context(t)
	scope := snapshot.Scope{TenantID: "t1", ProjectID: project}
	rec := newScopeRecorder(e)
	res, err := e.checkScopes(ctx, rec.request(scope))
	if err != nil || len(res.Repaired) != 1 || len(res.Announced) != 1 {
		t.Fatalf("CheckScopes = %+v, %v; want one repaired, one announced", res, err)
	}
	if rec.published[dbOnly] != 1 || rec.announced[stored] != 1 || len(rec.published) != 1 || len(rec.announced) != 1 {
		t.Fatalf("published %v, announced %v; want %s published and %s announced", rec.published, rec.announced, dbOnly, stored)
	}
	if e.redisVersion(t, dbOnly) != 1 {
		t.Fatalf("Redis lacks %s after the repair", dbOnly)
	}
	st := e.stats()
	if st.ScopesListed != 1 || st.CheckQueries != 1 || st.CheckRows != 4 || st.Repaired != 1 || st.Announced != 1 {
		t.Fatalf("stats %+v; want one scope listed in one query of 3 versions and the one row read, one repaired, one announced", st)
	}
	// The other node, within the hold: nothing to list.
	if res, err := other.checkScopes(ctx, rec.request(scope)); err != nil || len(res.Repaired)+len(res.Announced) != 0 || other.stats().CheckQueries != 0 {
		t.Fatalf("second node within the hold: %+v, %v, %d queries; want nothing", res, err, other.stats().CheckQueries)
	}
	// The young row has aged; the hold passed. What was taken is not again.
	row(young, ago)
	e.expireScopeClaim(t, "project", "t1", project)
	clear(rec.published)
	clear(rec.announced)
	if _, err := other.checkScopes(ctx, rec.request(scope)); err != nil || rec.published[young] != 1 || len(rec.published) != 1 || len(rec.announced) != 0 {
		t.Fatalf("next listing: %v, published %v, announced %v; want only %s published", err, rec.published, rec.announced, young)
	}
}

// A user scope lists the user's tasks of every project, and no other
// tenant's.
func TestCheckScopesListsAUsersTasks(t *testing.T) {
	e := newCheckEnv(t, store.Config{})
	user := testenv.UniqueID("u")
	mine, foreign := testenv.UniqueID("mine"), testenv.UniqueID("foreign")
	ago := time.Now().Add(-2 * time.Second)
	e.pg.InsertTask(t, testenv.Task{ID: mine, TenantID: "t1", ProjectID: testenv.UniqueID("p"), UserID: user, Status: "QUEUED", Version: 3, UpdatedAt: ago})
	e.pg.InsertTask(t, testenv.Task{ID: foreign, TenantID: "t2", ProjectID: "p1", UserID: user, Status: "QUEUED", Version: 1, UpdatedAt: ago})
	rec := newScopeRecorder(e)
	res, err := e.checkScopes(testenv.Context(t), rec.request(snapshot.Scope{TenantID: "t1", UserID: user}))
	if err != nil || len(res.Repaired) != 1 || res.Repaired[0].TaskID != mine || res.Repaired[0].Version != 3 {
		t.Fatalf("CheckScopes = %+v, %v; want %s v3 repaired alone", res, err, mine)
	}
}

// A scope with more changes than one listing reads is read over the next
// listings, oldest first, none skipped.
func TestCheckScopesPagesThroughABurst(t *testing.T) {
	e := newCheckEnv(t, store.Config{})
	project := testenv.UniqueID("p")
	const n = converge.MaxScopeRows + 20
	base := time.Now().Add(-30 * time.Second)
	_, err := e.pg.Pool.Exec(testenv.Context(t), `
		INSERT INTO generation_tasks (id, tenant_id, project_id, user_id, status, progress, version, updated_at)
		SELECT $1 || '_' || i, 't1', $2, 'u1', 'RUNNING', 10, 1, $3::timestamptz + i * interval '1 ms' FROM generate_series(1, $4::int) AS i`,
		project, project, base, n)
	if err != nil {
		t.Fatal(err)
	}
	rec := newScopeRecorder(e)
	scope := snapshot.Scope{TenantID: "t1", ProjectID: project}
	ctx := testenv.Context(t)
	if _, err := e.checkScopes(ctx, rec.request(scope)); err != nil || len(rec.published) != converge.MaxScopeRows {
		t.Fatalf("first listing: %v, %d published; want %d", err, len(rec.published), converge.MaxScopeRows)
	}
	e.expireScopeClaim(t, "project", "t1", project)
	if _, err := e.checkScopes(ctx, rec.request(scope)); err != nil || len(rec.published) != n {
		t.Fatalf("second listing: %v, %d published in all; want %d", err, len(rec.published), n)
	}
}

// A scope's first listing reaches back to when the node began to watch
// it, less the look back: a task created after the subscription's initial
// read and more than a look back before the first round (which backoff
// may delay by intervals) is listed all the same. Without the scope's
// time, the listing reaches one look back behind now.
func TestCheckScopesFirstListingReachesBackToTheWatch(t *testing.T) {
	e := newCheckEnv(t, store.Config{})
	project := testenv.UniqueID("p")
	created := testenv.UniqueID("created")
	e.pg.InsertTask(t, testenv.Task{ID: created, TenantID: "t1", ProjectID: project, UserID: "u1", Status: "QUEUED", Version: 1, UpdatedAt: time.Now().Add(-3 * time.Second)})
	rec := newScopeRecorder(e)
	unknown := rec.request(snapshot.Scope{TenantID: "t1", ProjectID: project})
	unknown.LookBack = time.Second
	if _, err := e.checkScopes(testenv.Context(t), unknown); err != nil || len(rec.published) != 0 {
		t.Fatalf("listing with no watch time: %v, published %v; want nothing (the change is 3 s old, the look back 1 s)", err, rec.published)
	}
	// The claim and marker that listing left are what another node finds
	// first; a scope nobody listed has neither.
	if err := e.r.Client.Del(testenv.Context(t), e.r.Names.ScopeChecked("t1", "project", project)).Err(); err != nil {
		t.Fatal(err)
	}
	watched := rec.request(snapshot.Scope{TenantID: "t1", ProjectID: project, WatchedSince: time.Now().Add(-5 * time.Second).UnixMilli()})
	watched.LookBack = time.Second
	if _, err := e.checkScopes(testenv.Context(t), watched); err != nil || rec.published[created] != 1 {
		t.Fatalf("first listing of a scope watched for 5 s: %v, published %v; want %s v1", err, rec.published, created)
	}
}
