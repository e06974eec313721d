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

// On Redis Cluster a failed read makes reads skip Redis only for the tasks
// of the master it failed on. With one master of three stopped (and kept
// out of service: no replica takes over yet), the first read of one of its
// tasks fails and falls back to PostgreSQL; until its backoff ends, reads
// of the other masters' tasks, one by one and in a batch, are still served
// by Redis, while the stopped master's tasks are skipped. Once its replica
// takes over, its tasks are read from Redis again.
func TestStoreSkipsOnlyTheFailedMaster(t *testing.T) {
	c := testenv.StartRedisCluster(t, 3)
	// The stopped master stays the owner of its slots until the test
	// promotes its replica, and the other masters keep serving theirs.
	c.ConfigSet("cluster-replica-no-failover", "yes")
	c.ConfigSet("cluster-require-full-coverage", "no")
	cc := c.Client()
	pg := testenv.Database(t)
	names := keys.Names{Cluster: true}
	ctx := testenv.Context(t)

	ids, byMaster := c.Spread(2, func(i int) string { return fmt.Sprintf("%s-%d", testenv.UniqueID("task"), i) }, names.Snapshot)
	writer := newStore(t, store.Config{Redis: cc, Names: names})
	for _, id := range ids {
		if written, err := writer.SetIfNewer(ctx, snapshottest.Snapshot(t, id, "t1", "SUCCEEDED", 2)); err != nil || !written {
			t.Fatalf("SetIfNewer %s: %v, %v", id, written, err)
		}
		pg.InsertTask(t, testenv.Task{ID: id, TenantID: "t1", ProjectID: "p1", UserID: "u1",
			Status: "SUCCEEDED", Progress: 100, Version: 2, UpdatedAt: time.UnixMilli(1710000000000)})
	}
	c.WaitReplicated() // the replica promoted at the end has every task
	victim := c.Masters()[0]
	dead := byMaster[victim.Addr]
	var healthy []string
	for addr, served := range byMaster {
		if addr != victim.Addr {
			healthy = append(healthy, served...)
		}
	}
	victim.Stop()

	// No process cache: every read goes to Redis, unless skipped.
	s := newStore(t, store.Config{Redis: cc, DB: pg.Pool, Names: names, CacheTTL: -1})
	get := func(id string) *snapshot.Snapshot {
		t.Helper()
		snap, err := s.Get(ctx, id, 0)
		if err != nil || snap.Version != 2 {
			t.Fatalf("Get %s: %+v, %v", id, snap, err)
		}
		return snap
	}
	// A round is valid if the backoff the first read opens lasts to its
	// last read: one Redis error in the round, and the last read skipped.
	// Only a stalled machine makes a round outlast it; then another runs.
	for round := 1; ; round++ {
		start := s.Stats()
		if snap := get(dead[0]); snap.Origin != snapshot.OriginPostgres {
			t.Fatalf("round %d: %s of the stopped master from %v, want postgres", round, dead[0], snap.Origin)
		}
		if st := s.Stats(); st.RedisErrors != start.RedisErrors+1 || st.RedisSkipped != start.RedisSkipped {
			t.Fatalf("round %d: the read of a stopped master's task: %d errors, %d skipped; want it to fail once, no skip",
				round, st.RedisErrors-start.RedisErrors, st.RedisSkipped-start.RedisSkipped)
		}
		failed := s.Stats()
		single := make(map[string]snapshot.Origin)
		for _, id := range healthy {
			single[id] = get(id).Origin
		}
		got, err := s.GetMany(ctx, ids)
		if err != nil {
			t.Fatalf("round %d: GetMany: %v", round, err)
		}
		for _, id := range ids {
			if got[id] == nil {
				t.Fatalf("round %d: GetMany lacks %s", round, id)
			}
		}
		get(dead[1])
		end := s.Stats()
		if end.RedisErrors != failed.RedisErrors || end.RedisSkipped == failed.RedisSkipped {
			t.Logf("round %d outlasted the backoff (%d more errors, %d skipped); again", round,
				end.RedisErrors-failed.RedisErrors, end.RedisSkipped-failed.RedisSkipped)
			if round == 5 {
				t.Fatal("no round within the backoff")
			}
			continue
		}
		// Skipped: the stopped master's tasks in the batch, and the last read.
		if n := end.RedisSkipped - failed.RedisSkipped; n != uint64(len(dead)+1) {
			t.Errorf("%d reads skipped Redis, want %d: the stopped master's tasks only", n, len(dead)+1)
		}
		for _, id := range healthy {
			if single[id] != snapshot.OriginRedis {
				t.Errorf("Get: %s of a running master from %v, want redis", id, single[id])
			}
			if got[id].Origin != snapshot.OriginRedis {
				t.Errorf("GetMany: %s of a running master from %v, want redis", id, got[id].Origin)
			}
		}
		for _, id := range dead {
			if got[id].Origin != snapshot.OriginPostgres {
				t.Errorf("GetMany: %s of the stopped master from %v, want postgres", id, got[id].Origin)
			}
		}
		break
	}

	// The replica takes over the stopped master's slots: a read that fails
	// on the old master has the client reload its slot map, and the new
	// master has no backoff of its own.
	c.Takeover(victim.Addr)
	testenv.Eventually(t, "a read of the stopped master's task from its promoted replica", func() bool {
		snap, err := s.Get(ctx, dead[0], 0)
		return err == nil && snap.Origin == snapshot.OriginRedis
	})
}
