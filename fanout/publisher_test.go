package fanout

import (
	"bytes"
	"strconv"
	"testing"

	"github.com/pushd/pushd/internal/testenv"
	"github.com/pushd/pushd/snapshot"
)

// RedisPublisher writes and announces in one step: a stale snapshot is
// neither stored nor announced.
func TestRedisPublisher(t *testing.T) {
	rd := testenv.SharedRedis(t)
	b, r := newBus(t, rd.Client, rd.Names, BusConfig{})
	tenant := testenv.UniqueID("tenant")
	task := testenv.UniqueID("task")
	mustSubscribe(t, b, tenant)
	p := NewRedisPublisher(rd.Client, rd.Names)
	ctx := testContext(t)

	if err := rd.Client.Set(ctx, rd.Names.NotFound(task), "1", 0).Err(); err != nil {
		t.Fatal(err)
	}
	for _, step := range []struct {
		version int64
		written bool
	}{{2, true}, {1, false}, {2, false}, {3, true}} {
		s := testSnapshot(t, tenant, task, step.version)
		written, err := p.Publish(ctx, s)
		if err != nil || written != step.written {
			t.Fatalf("publish version %d = %v, %v, want %v", step.version, written, err, step.written)
		}
		if !step.written {
			continue
		}
		// Notifications of one publisher arrive in order: the next one heard
		// is this version's, so a stale one was never announced.
		want := snapshot.Notification{TenantID: tenant, TaskID: task, Version: step.version, ProjectID: "p1",
			UserID: "u1", Status: "RUNNING", OccurredAt: 1710000000000}
		if got := next(t, r.notes, "notification"); got != want {
			t.Fatalf("got %+v, want %+v", got, want)
		}
		stored, err := rd.Client.Get(ctx, rd.Names.Snapshot(task)).Bytes()
		if err != nil || !bytes.Equal(stored, s.JSON()) {
			t.Fatalf("stored %s, %v; want %s", stored, err, s.JSON())
		}
	}
	if n, err := rd.Client.Exists(ctx, rd.Names.NotFound(task)).Result(); err != nil || n != 0 {
		t.Fatalf("negative cache left: %d, %v", n, err)
	}
	none(t, r.notes, "notification")
	if s := b.Stats(); s.Malformed != 0 {
		t.Fatalf("the publisher's notifications were malformed: %+v", s)
	}
}

// WithStream appends each stored change to the tenant's stream in the same
// round trip, stale ones not at all, and keeps the stream within its
// approximate MAXLEN under a sustained load.
func TestRedisPublisherWithStream(t *testing.T) {
	rd := testenv.SharedRedis(t)
	tenant := testenv.UniqueID("tenant")
	const maxLen = 50
	p := NewRedisPublisher(rd.Client, rd.Names, WithStream(maxLen))
	ctx := testContext(t)
	stream := rd.Names.Stream(tenant)

	task := testenv.UniqueID("task")
	for _, v := range []int64{3, 2, 3} {
		if _, err := p.Publish(ctx, testSnapshot(t, tenant, task, v)); err != nil {
			t.Fatal(err)
		}
	}
	if n := rd.Client.XLen(ctx, stream).Val(); n != 1 {
		t.Fatalf("XLEN %d after one fresh and two stale versions, want 1", n)
	}

	// Sustained load: many tasks, many versions. MAXLEN ~ trims whole
	// macro nodes (stream-node-max-entries, 100 by default), so the stream
	// may exceed maxLen by up to one node, never more.
	const slack = 100
	var maxSeen int64
	for i := range 2000 {
		s := testSnapshot(t, tenant, "task_"+strconv.Itoa(i%37), int64(10+i))
		if written, err := p.Publish(ctx, s); err != nil || !written {
			t.Fatalf("publish %d: %v, %v", i, written, err)
		}
		if i%50 == 0 {
			maxSeen = max(maxSeen, rd.Client.XLen(ctx, stream).Val())
		}
	}
	n := rd.Client.XLen(ctx, stream).Val()
	maxSeen = max(maxSeen, n)
	t.Logf("after 2001 appends with MAXLEN ~ %d: XLEN %d, at most %d seen", maxLen, n, maxSeen)
	if maxSeen > maxLen+slack || n < maxLen {
		t.Fatalf("XLEN reached %d (now %d), want within [%d, %d]", maxSeen, n, maxLen, maxLen+slack)
	}
}
