package fanout

import (
	"errors"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/pushd/pushd/snapshot"
	"github.com/pushd/pushd/snapshot/rediswrite"
)

// On Redis Cluster, WithStream's second step is one script in the tenant's
// slot: every written version appends exactly one entry and is SPUBLISHed,
// a stale one neither; a Current version (a retry) is announced again but
// appends only when its first announcement never reached the stream; the
// stream's creation sets its epoch; another tenant's snapshot of a stored
// task is refused and never announced. Tenants live on every master.
func TestClusterPublisherWithStream(t *testing.T) {
	f := newClusterFixture(t, 1)
	for _, tenant := range f.tenants {
		mustSubscribe(t, f.bus, tenant)
	}
	p := NewRedisPublisher(f.cl, clusterNames, WithStream(1000))
	ctx := testContext(t)

	for _, tenant := range f.tenants {
		task := "task-" + tenant
		stream := clusterNames.Stream(tenant)
		for _, step := range []struct {
			version   int64
			written   bool
			announced bool
		}{{2, true, true}, {1, false, false}, {2, false, true}, {3, true, true}} {
			written, err := p.Publish(ctx, testSnapshot(t, tenant, task, step.version))
			if err != nil || written != step.written {
				t.Fatalf("%s: publish v%d = %v, %v; want %v", tenant, step.version, written, err, step.written)
			}
			if !step.announced {
				continue
			}
			// One publisher's notifications arrive in order: the next one
			// is this version's, so the stale one was never announced.
			if n := next(t, f.r.notes, "notification"); n.TenantID != tenant || n.Version != step.version {
				t.Fatalf("%s v%d: heard %+v", tenant, step.version, n)
			}
		}
		entries, err := f.cl.XRange(ctx, stream, "-", "+").Result()
		if err != nil {
			t.Fatal(err)
		}
		if got := entryVersions(entries); got != "2,3" {
			t.Fatalf("%s: stream holds versions %s, want 2,3 (one entry per written version)", tenant, got)
		}
		for k, want := range map[string]any{"task_id": task, "event_type": rediswrite.EventChanged, "project_id": "p1", "user_id": "u1", "occurred_at": "1710000000000"} {
			if got := entries[0].Values[k]; got != want {
				t.Fatalf("%s: entry field %s = %v, want %v", tenant, k, got, want)
			}
		}
		if epoch, err := f.cl.Get(ctx, clusterNames.StreamEpoch(tenant)).Result(); err != nil || epoch != entries[0].ID {
			t.Fatalf("%s: epoch %q, %v; want the first entry's id %s", tenant, epoch, err, entries[0].ID)
		}

		// The announcement of v4 failed after its snapshot was stored (here:
		// never sent). The caller's retry finds v4 Current, appends its entry
		// and announces it.
		if out, err := rediswrite.WriteIfNewer(ctx, f.cl, clusterNames, testSnapshot(t, tenant, task, 4), 0); err != nil || out != rediswrite.Written {
			t.Fatalf("%s: write v4 = %v, %v", tenant, out, err)
		}
		if written, err := p.Publish(ctx, testSnapshot(t, tenant, task, 4)); err != nil || written {
			t.Fatalf("%s: retry of v4 = %v, %v; want not written, no error", tenant, written, err)
		}
		if n := next(t, f.r.notes, "notification"); n.TenantID != tenant || n.Version != 4 {
			t.Fatalf("%s v4: heard %+v", tenant, n)
		}
		if got := entryVersions(f.cl.XRange(ctx, stream, "-", "+").Val()); got != "2,3,4" {
			t.Fatalf("%s: after the retry the stream holds %s, want 2,3,4", tenant, got)
		}

		// Redis lost the stream: the next write makes a new incarnation with
		// a new epoch.
		if err := f.cl.Del(ctx, stream).Err(); err != nil {
			t.Fatal(err)
		}
		if written, err := p.Publish(ctx, testSnapshot(t, tenant, task, 5)); err != nil || !written {
			t.Fatalf("%s: publish v5 = %v, %v", tenant, written, err)
		}
		next(t, f.r.notes, "notification of v5")
		again := f.cl.XRange(ctx, stream, "-", "+").Val()
		if epoch := f.cl.Get(ctx, clusterNames.StreamEpoch(tenant)).Val(); len(again) != 1 || epoch != again[0].ID || epoch == entries[0].ID {
			t.Fatalf("%s: recreated stream %v with epoch %q; want one entry, its id the new epoch", tenant, again, epoch)
		}
	}

	// Another tenant's snapshot of a stored task is refused before any
	// announcement: the next notification heard on that tenant's channel
	// is the marker published after it.
	owner, other := f.tenants[0], f.tenants[len(f.tenants)-1]
	if written, err := p.Publish(ctx, testSnapshot(t, other, "task-"+owner, 9)); written || !errors.Is(err, snapshot.ErrTenantMismatch) {
		t.Fatalf("publish of %s's task by %s = %v, %v; want refused with ErrTenantMismatch", owner, other, written, err)
	}
	if written, err := p.Publish(ctx, testSnapshot(t, other, "marker-"+other, 1)); err != nil || !written {
		t.Fatalf("publish marker = %v, %v", written, err)
	}
	if n := next(t, f.r.notes, "notification"); n.TaskID != "marker-"+other {
		t.Fatalf("heard %+v before the marker", n)
	}
	if s := p.Stats(); s.TenantMismatches != 1 {
		t.Fatalf("stats %+v, want one tenant mismatch", s)
	}
	none(t, f.r.notes, "notification")
	f.noCrossSlot(t)
}

// Announce never announces a stale version.
func TestAnnounceRefusesStale(t *testing.T) {
	if _, err := rediswrite.Announce(testContext(t), nil, clusterNames, rediswrite.Announcement{
		Snapshot: testSnapshot(t, "t1", "task", 1), Outcome: rediswrite.Stale, Channel: "c", StreamMaxLen: 10,
	}); err == nil {
		t.Fatal("Announce of a stale version succeeded")
	}
}

func entryVersions(entries []redis.XMessage) string {
	var out []string
	for _, e := range entries {
		v, _ := e.Values["version"].(string)
		out = append(out, v)
	}
	return strings.Join(out, ",")
}
