package fanout

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/pushd/pushd/internal/testenv"
	"github.com/pushd/pushd/snapshot"
	"github.com/pushd/pushd/snapshot/store"
)

// A v5 whose field nests 1,000 levels, stored as an older publisher could
// (Parse now refuses it), is a document Redis's Lua cannot decode. A v3
// published over it is refused, not written and not announced, and a reader
// of Redis never gets v3.
func TestRedisPublisherRefusesRollbackOverDeepDocument(t *testing.T) {
	rd := testenv.SharedRedis(t)
	b, r := newBus(t, rd.Client, rd.Names, BusConfig{})
	tenant := testenv.UniqueID("tenant")
	task := testenv.UniqueID("task")
	mustSubscribe(t, b, tenant)
	p := NewRedisPublisher(rd.Client, rd.Names)
	ctx := testContext(t)

	deep := fmt.Sprintf(`{"task_id":%q,"tenant_id":%q,"status":"RUNNING","version":5,"x":%s%s}`,
		task, tenant, strings.Repeat("[", 1000), strings.Repeat("]", 1000))
	if _, err := snapshot.Parse([]byte(deep)); err == nil {
		t.Fatal("Parse accepted a document nested 1,000 levels")
	}
	if err := rd.Client.Set(ctx, rd.Names.Snapshot(task), deep, time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	written, err := p.Publish(ctx, testSnapshot(t, tenant, task, 3))
	if written || !errors.Is(err, snapshot.ErrStoredUnreadable) {
		t.Fatalf("publish v3 over the undecodable v5 = %v, %v; want refused with ErrStoredUnreadable", written, err)
	}
	if got := rd.Client.Get(ctx, rd.Names.Snapshot(task)).Val(); got != deep {
		t.Fatalf("the stored v5 was replaced by %.80s", got)
	}
	if s := p.Stats(); s.UnreadableStored != 1 {
		t.Fatalf("stats %+v, want one unreadable refusal", s)
	}
	reader := store.New(store.Config{Redis: rd.Client, Names: rd.Names})
	t.Cleanup(reader.Close)
	if got, err := reader.Get(ctx, task, 0); err == nil && got.Version == 3 {
		t.Fatalf("a reader got v3 after v5 was stored")
	}
	// Notifications of one publisher arrive in order: had v3 been announced,
	// it would be heard before this marker.
	marker := testenv.UniqueID("task")
	if written, err := p.Publish(ctx, testSnapshot(t, tenant, marker, 1)); err != nil || !written {
		t.Fatalf("publish marker = %v, %v", written, err)
	}
	if n := next(t, r.notes, "notification"); n.TaskID != marker {
		t.Fatalf("heard %+v before the marker", n)
	}
}

// Task ids are global: tenant B publishing an id tenant A owns is refused
// with ErrTenantMismatch whatever its version, counted, neither stored nor
// announced, so the task stays A's; A's next version is still published.
func TestRedisPublisherRefusesAnotherTenant(t *testing.T) {
	rd := testenv.SharedRedis(t)
	b, r := newBus(t, rd.Client, rd.Names, BusConfig{})
	owner, other := testenv.UniqueID("tenant"), testenv.UniqueID("tenant")
	task := testenv.UniqueID("task")
	mustSubscribe(t, b, owner)
	mustSubscribe(t, b, other)
	p := NewRedisPublisher(rd.Client, rd.Names, WithStream(100))
	ctx := testContext(t)

	if written, err := p.Publish(ctx, testSnapshot(t, owner, task, 2)); err != nil || !written {
		t.Fatalf("publish by the owner = %v, %v", written, err)
	}
	if n := next(t, r.notes, "notification"); n.TenantID != owner || n.Version != 2 {
		t.Fatalf("heard %+v, want the owner's v2", n)
	}
	for _, v := range []int64{1, 2, 3} {
		written, err := p.Publish(ctx, testSnapshot(t, other, task, v))
		if written || !errors.Is(err, snapshot.ErrTenantMismatch) {
			t.Fatalf("publish v%d by another tenant = %v, %v; want refused with ErrTenantMismatch", v, written, err)
		}
	}
	if s := p.Stats(); s.TenantMismatches != 3 {
		t.Fatalf("stats %+v, want three tenant mismatches", s)
	}
	reader := store.New(store.Config{Redis: rd.Client, Names: rd.Names})
	t.Cleanup(reader.Close)
	if got, err := reader.Get(ctx, task, 0); err != nil || got.TenantID != owner || got.Version != 2 {
		t.Fatalf("a reader got %+v, %v; want the owner's v2", got, err)
	}
	if n := rd.Client.XLen(ctx, rd.Names.Stream(other)).Val(); n != 0 {
		t.Fatalf("the other tenant's stream holds %d entries, want none", n)
	}
	if written, err := p.Publish(ctx, testSnapshot(t, owner, task, 3)); err != nil || !written {
		t.Fatalf("publish v3 by the owner = %v, %v", written, err)
	}
	// In publish order: a refused version announced would come first.
	if n := next(t, r.notes, "notification"); n.TenantID != owner || n.Version != 3 {
		t.Fatalf("heard %+v, want the owner's v3", n)
	}
	none(t, r.notes, "notification")
}
