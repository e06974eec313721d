package store_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/pushd/pushd/internal/testenv"
	"github.com/pushd/pushd/keys"
	"github.com/pushd/pushd/snapshot"
	"github.com/pushd/pushd/snapshot/rediswrite"
	"github.com/pushd/pushd/snapshot/snapshottest"
	"github.com/pushd/pushd/snapshot/store"
)

// On Redis Cluster, with the cluster's key names, every path of the store
// works over tasks whose keys live on every master: the write script, the
// batched read (no cross-slot MGET), the PostgreSQL fallback's write-back,
// the negative cache's script, and WriteIfNewer's outcomes, refusals
// included. The cluster never answers CROSSSLOT.
func TestStoreOnRedisCluster(t *testing.T) {
	c := testenv.StartRedisCluster(t, 3)
	cc := c.Client()
	pg := testenv.Database(t)
	names := keys.Names{Cluster: true}
	s := newStore(t, store.Config{Redis: cc, DB: pg.Pool, Names: names})
	ctx := testenv.Context(t)

	// Tasks whose snapshot slots are served by each of the three masters.
	ids, _ := c.Spread(3, func(i int) string { return fmt.Sprintf("%s-%d", testenv.UniqueID("task"), i) }, names.Snapshot)
	for _, id := range ids[:6] {
		if written, err := s.SetIfNewer(ctx, snapshottest.Snapshot(t, id, "t1", "RUNNING", 2)); err != nil || !written {
			t.Fatalf("SetIfNewer %s: %v, %v", id, written, err)
		}
	}
	for _, id := range ids[6:] { // only in PostgreSQL: read through and written back
		pg.InsertTask(t, testenv.Task{ID: id, TenantID: "t1", ProjectID: "p1", UserID: "u1",
			Status: "SUCCEEDED", Progress: 100, Version: 3, UpdatedAt: time.UnixMilli(1710000000000)})
	}

	// A second store has no process cache: everything comes from the cluster
	// or PostgreSQL, in batches.
	other := newStore(t, store.Config{Redis: cc, DB: pg.Pool, Names: names})
	ghost := testenv.UniqueID("ghost")
	got, err := other.GetMany(ctx, append(ids, ghost))
	if err != nil {
		t.Fatalf("GetMany: %v", err)
	}
	for i, id := range ids {
		want := int64(2)
		if i >= 6 {
			want = 3
		}
		if s := got[id]; s == nil || s.Version != want {
			t.Errorf("GetMany %s: %+v, want version %d", id, s, want)
		}
	}
	if got[ghost] != nil {
		t.Errorf("GetMany found the absent task %s", ghost)
	}
	if st := other.Stats(); st.RedisErrors != 0 || st.WriteBacks != 3 {
		t.Errorf("stats %+v: want no Redis error and the three PostgreSQL rows written back", st)
	}
	for _, id := range ids[6:] {
		if n, err := cc.Exists(ctx, names.Snapshot(id)).Result(); err != nil || n != 1 {
			t.Errorf("%s not written back to the cluster: %d, %v", id, n, err)
		}
	}
	if _, err := other.Get(ctx, ghost, 0); !errors.Is(err, snapshot.ErrNotFound) {
		t.Fatalf("Get of an absent task: %v, want ErrNotFound", err)
	}
	if n, err := cc.Exists(ctx, names.NotFound(ghost)).Result(); err != nil || n != 1 {
		t.Errorf("negative cache of %s not set on the cluster: %d, %v", ghost, n, err)
	}

	// The outcomes a cluster publisher relies on.
	id := ids[0]
	for _, step := range []struct {
		version int64
		want    rediswrite.Outcome
	}{{1, rediswrite.Stale}, {2, rediswrite.Current}, {4, rediswrite.Written}} {
		out, err := rediswrite.WriteIfNewer(ctx, cc, names, snapshottest.Snapshot(t, id, "t1", "RUNNING", step.version), 0)
		if err != nil || out != step.want {
			t.Errorf("WriteIfNewer v%d = %v, %v; want %v", step.version, out, err, step.want)
		}
	}
	// The refusals, whose keys are in the task's slot too.
	if out, err := rediswrite.WriteIfNewer(ctx, cc, names, snapshottest.Snapshot(t, id, "t2", "RUNNING", 5), 0); out != rediswrite.TenantMismatch || !errors.Is(err, snapshot.ErrTenantMismatch) {
		t.Errorf("WriteIfNewer of another tenant = %v, %v; want TenantMismatch", out, err)
	}
	deep := ids[1]
	if err := cc.Set(ctx, names.Snapshot(deep), snapshottest.DeepDoc(deep, "t1", 5, 1000), time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	if out, err := rediswrite.WriteIfNewer(ctx, cc, names, snapshottest.Snapshot(t, deep, "t1", "RUNNING", 3), 0); out != rediswrite.Unreadable || !errors.Is(err, snapshot.ErrStoredUnreadable) {
		t.Errorf("WriteIfNewer v3 over an undecodable v5 = %v, %v; want Unreadable", out, err)
	}
	if n := c.ErrorCount("CROSSSLOT"); n != 0 {
		t.Fatalf("the cluster answered CROSSSLOT %d times", n)
	}
}
