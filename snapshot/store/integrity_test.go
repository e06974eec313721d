package store_test

import (
	"errors"
	"testing"
	"time"

	"github.com/pushd/pushd/internal/testenv"
	"github.com/pushd/pushd/snapshot"
	"github.com/pushd/pushd/snapshot/rediswrite"
	"github.com/pushd/pushd/snapshot/snapshottest"
	"github.com/pushd/pushd/snapshot/store"
)

// A task belongs to the tenant it was first stored for: another tenant's
// snapshot of it is refused whatever its version, counted, and not cached,
// so neither Redis readers nor this node's cache see the task move; its
// own tenant's next version is still written. The embedded mode's
// MemoryStore refuses it too.
func TestWriteRefusesAnotherTenant(t *testing.T) {
	t.Parallel()
	e := newEnv(t, store.Config{CacheTTL: time.Hour})
	ctx := testenv.Context(t)
	id := testenv.UniqueID("task")
	if ok, err := e.store.SetIfNewer(ctx, snapshottest.Snapshot(t, id, "t1", "RUNNING", 2)); err != nil || !ok {
		t.Fatalf("SetIfNewer t1 v2 = %v, %v", ok, err)
	}
	for _, v := range []int64{1, 2, 3} {
		ok, err := e.store.SetIfNewer(ctx, snapshottest.Snapshot(t, id, "t2", "RUNNING", v))
		if ok || !errors.Is(err, snapshot.ErrTenantMismatch) {
			t.Errorf("SetIfNewer t2 v%d = %v, %v; want false, ErrTenantMismatch", v, ok, err)
		}
	}
	if st := e.store.Stats(); st.TenantMismatches != 3 {
		t.Errorf("TenantMismatches = %d, want 3", st.TenantMismatches)
	}
	if got := mustGet(t, e.store, id, 0); got.TenantID != "t1" || got.Version != 2 {
		t.Errorf("the store serves %s v%d, want t1 v2", got.TenantID, got.Version)
	}
	fresh := newStore(t, store.Config{Redis: e.r.Client, Names: e.r.Names})
	if got := mustGet(t, fresh, id, 0); got.TenantID != "t1" || got.Version != 2 {
		t.Errorf("Redis serves %s v%d, want t1 v2", got.TenantID, got.Version)
	}
	if ok, err := e.store.SetIfNewer(ctx, snapshottest.Snapshot(t, id, "t1", "RUNNING", 3)); err != nil || !ok {
		t.Errorf("SetIfNewer t1 v3 = %v, %v; want written", ok, err)
	}

	m := snapshot.NewMemoryStore()
	if ok, err := m.SetIfNewer(ctx, snapshottest.Snapshot(t, id, "t1", "RUNNING", 1)); err != nil || !ok {
		t.Fatalf("MemoryStore t1 v1 = %v, %v", ok, err)
	}
	if ok, err := m.SetIfNewer(ctx, snapshottest.Snapshot(t, id, "t2", "RUNNING", 2)); ok || !errors.Is(err, snapshot.ErrTenantMismatch) {
		t.Errorf("MemoryStore t2 v2 = %v, %v; want false, ErrTenantMismatch", ok, err)
	}
}

// The script compares with what it stored beside the document, but a
// document written by hand since (README's third way) is read for its own
// version and tenant: another tenant's write is refused, a newer version
// set by hand is not overwritten by an older publish, and versions near
// 2^53 compare exactly.
func TestWriteReadsDocumentSetByHand(t *testing.T) {
	t.Parallel()
	r := testenv.SharedRedis(t)
	ctx := testenv.Context(t)
	id := testenv.UniqueID("task")
	key := r.Names.Snapshot(id)
	write := func(tenant string, v int64) rediswrite.Outcome {
		t.Helper()
		out, _ := rediswrite.WriteIfNewer(ctx, r.Client, r.Names, snapshottest.Snapshot(t, id, tenant, "RUNNING", v), 0)
		return out
	}
	if out := write("t1", 5); out != rediswrite.Written {
		t.Fatalf("v5: %v", out)
	}
	r.Client.Set(ctx, key, snapshottest.Doc(id, "t1", "RUNNING", 7), time.Minute)
	for _, step := range []struct {
		tenant string
		v      int64
		want   rediswrite.Outcome
	}{
		{"t2", 8, rediswrite.TenantMismatch},
		{"t1", 6, rediswrite.Stale},
		{"t1", 7, rediswrite.Current},
		{"t1", snapshot.MaxVersion - 1, rediswrite.Written},
		{"t1", snapshot.MaxVersion - 2, rediswrite.Stale},
		{"t1", snapshot.MaxVersion, rediswrite.Written},
		{"t1", snapshot.MaxVersion, rediswrite.Current},
	} {
		if out := write(step.tenant, step.v); out != step.want {
			t.Errorf("%s v%d: %v, want %v", step.tenant, step.v, out, step.want)
		}
	}
	if got := snapshottest.MustParse(t, []byte(r.Client.Get(ctx, key).Val())); got.Version != snapshot.MaxVersion {
		t.Errorf("stored v%d, want v%d", got.Version, int64(snapshot.MaxVersion))
	}
}
