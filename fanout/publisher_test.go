package fanout

import (
	"bytes"
	"testing"

	"github.com/pushd/pushd/testenv"
)

// RedisPublisher writes and announces in one step: a stale snapshot is
// neither stored nor announced.
func TestRedisPublisher(t *testing.T) {
	rd := testenv.SharedRedis(t)
	b, r := newBus(t, rd.Client, rd.Names, RedisConfig{})
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
		want := Notification{TenantID: tenant, TaskID: task, Version: step.version, ProjectID: "p1",
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
