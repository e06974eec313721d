package rediswrite_test

import (
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pushd/pushd/internal/testenv"
	"github.com/pushd/pushd/snapshot/rediswrite"
	"github.com/pushd/pushd/snapshot/snapshottest"
)

// The journal's removal rule on real Redis: a journal step of a version
// already journaled raises its score, even above a score set by a clock
// ahead of this one; Forget and Announce remove an entry only with a score
// not below the stored one, so whoever holds the older score leaves the
// newer publish's entry; Announce with the zero Pending removes nothing.
func TestJournalRemovalRule(t *testing.T) {
	t.Parallel()
	r := testenv.SharedRedis(t)
	ctx := testenv.Context(t)
	tenant, task := testenv.UniqueID("tenant"), testenv.UniqueID("task")
	key := r.Names.Unannounced(tenant)
	s := snapshottest.Snapshot(t, task, tenant, "RUNNING", 7)
	score := func() float64 {
		t.Helper()
		v, err := r.Client.ZScore(ctx, key, task+" 7").Result()
		if err == redis.Nil {
			return 0
		}
		if err != nil {
			t.Fatal(err)
		}
		return v
	}

	first, err := rediswrite.Journal(ctx, r.Client, r.Names, s)
	if err != nil || first.TaskID != task || first.Version != 7 || float64(first.Since) != score() {
		t.Fatalf("Journal = %+v, %v; stored score %v", first, err, score())
	}
	if ttl := r.Client.PTTL(ctx, key).Val(); ttl <= rediswrite.JournalTTL-time.Minute || ttl > rediswrite.JournalTTL {
		t.Fatalf("journal PTTL %v, want about %v", ttl, rediswrite.JournalTTL)
	}
	// Another publisher, its clock a minute ahead, journals the same version.
	ahead := float64(time.Now().Add(time.Minute).UnixMilli())
	r.Client.ZAdd(ctx, key, redis.Z{Score: ahead, Member: task + " 7"})
	retry, err := rediswrite.Journal(ctx, r.Client, r.Names, s)
	if err != nil || float64(retry.Since) <= ahead {
		t.Fatalf("retry's Journal = %+v, %v; want a score above %v", retry, err, ahead)
	}

	if removed, err := rediswrite.Forget(ctx, r.Client, r.Names, tenant, first); err != nil || removed {
		t.Fatalf("Forget with the first score = %v, %v; want the retry's entry kept", removed, err)
	}
	ann := rediswrite.Announcement{Snapshot: s, Outcome: rediswrite.Written, Pending: first, Channel: r.Names.Channel(tenant), Message: []byte("m")}
	if _, err := rediswrite.Announce(ctx, r.Client, r.Names, ann); err != nil || score() != float64(retry.Since) {
		t.Fatalf("Announce with the first score: %v; score %v, want the retry's %d kept", err, score(), retry.Since)
	}
	ann.Pending = rediswrite.Pending{}
	if _, err := rediswrite.Announce(ctx, r.Client, r.Names, ann); err != nil || score() == 0 {
		t.Fatalf("Announce without a Pending: %v; score %v, want the entry kept", err, score())
	}
	ann.Pending = retry
	if _, err := rediswrite.Announce(ctx, r.Client, r.Names, ann); err != nil || score() != 0 {
		t.Fatalf("Announce with the retry's score: %v; score %v, want the entry removed", err, score())
	}
	if n := r.Client.Exists(ctx, key).Val(); n != 0 {
		t.Fatal("an empty journal is still a key")
	}
}

func TestParsePending(t *testing.T) {
	t.Parallel()
	if p, ok := rediswrite.ParsePending("task_1 12", 1700000000123); !ok || p != (rediswrite.Pending{TaskID: "task_1", Version: 12, Since: 1700000000123}) {
		t.Fatalf("ParsePending = %+v, %v", p, ok)
	}
	if p := (rediswrite.Pending{TaskID: "a:b", Version: 3}); p.Member() != "a:b 3" {
		t.Fatalf("Member = %q", p.Member())
	}
	for _, bad := range []string{"", "task_1", "task_1 x", "task_1 0", "task_1 -2", " 3", "a b 3"} {
		if p, ok := rediswrite.ParsePending(bad, 1); ok {
			t.Errorf("ParsePending(%q) = %+v, want false", bad, p)
		}
	}
}
