package rediswrite_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/pushd/pushd/internal/testenv"
	"github.com/pushd/pushd/keys"
	"github.com/pushd/pushd/snapshot"
	"github.com/pushd/pushd/snapshot/rediswrite"
	"github.com/pushd/pushd/snapshot/snapshottest"
)

func TestWriteOnlyNewer(t *testing.T) {
	t.Parallel()
	r := testenv.SharedRedis(t)
	ctx := testenv.Context(t)
	id := testenv.UniqueID("task")
	key := r.Names.Snapshot(id)

	for _, step := range []struct {
		version int64
		want    bool
		stored  int64
	}{
		{5, true, 5},   // nothing stored
		{5, false, 5},  // equal is not newer
		{4, false, 5},  // older
		{7, true, 7},   // newer
		{6, false, 7},  // older again
		{12, true, 12}, // numeric, not lexical, comparison
	} {
		got, err := rediswrite.Write(ctx, r.Client, r.Names, snapshottest.Snapshot(t, id, "t1", "RUNNING", step.version), 0, "", nil)
		if err != nil {
			t.Fatalf("Write v%d: %v", step.version, err)
		}
		if got != step.want {
			t.Errorf("Write v%d = %v, want %v", step.version, got, step.want)
		}
		stored := snapshottest.MustParse(t, []byte(r.Client.Get(ctx, key).Val()))
		if stored.Version != step.stored {
			t.Errorf("after Write v%d stored version %d, want %d", step.version, stored.Version, step.stored)
		}
	}
}

// A stored document whose version and tenant the script cannot read (junk,
// a document Redis's Lua cannot decode, one without a version or tenant)
// refuses every write: nothing proves the new version newer. One stored
// without a TTL gets the refused write's, so the task is not frozen forever.
func TestWriteRefusedOverUnreadable(t *testing.T) {
	t.Parallel()
	r := testenv.SharedRedis(t)
	ctx := testenv.Context(t)
	for _, junk := range []string{"not json", `{"version":"9","tenant_id":"t1"}`, `{"version":9}`, `[1,2]`, string(snapshottest.DeepDoc("x", "t1", 9, 1000))} {
		id := testenv.UniqueID("task")
		key := r.Names.Snapshot(id)
		r.Client.Set(ctx, key, junk, 0)
		got, err := rediswrite.Write(ctx, r.Client, r.Names, snapshottest.Snapshot(t, id, "t1", "RUNNING", 1), 0, "", nil)
		if got || !errors.Is(err, snapshot.ErrStoredUnreadable) {
			t.Errorf("Write over %.40q = %v, %v; want false, ErrStoredUnreadable", junk, got, err)
		}
		if stored := r.Client.Get(ctx, key).Val(); stored != junk {
			t.Errorf("Write over %.40q replaced it with %.60q", junk, stored)
		}
		if pttl := r.Client.PTTL(ctx, key).Val(); pttl <= 0 || pttl > snapshot.TTL("RUNNING")*11/10 {
			t.Errorf("%.40q left with PTTL %v, want the refused write's TTL", junk, pttl)
		}
	}
}

func TestWriteClearsNegativeCache(t *testing.T) {
	t.Parallel()
	r := testenv.SharedRedis(t)
	ctx := testenv.Context(t)
	id := testenv.UniqueID("task")
	nf := r.Names.NotFound(id)

	r.Client.Set(ctx, nf, "1", time.Minute)
	if ok, err := rediswrite.Write(ctx, r.Client, r.Names, snapshottest.Snapshot(t, id, "t1", "QUEUED", 3), 0, "", nil); err != nil || !ok {
		t.Fatalf("Write = %v, %v", ok, err)
	}
	if n := r.Client.Exists(ctx, nf).Val(); n != 0 {
		t.Errorf("negative-cache key survived a write")
	}
	// A marker set by a racing reader is wrong even when the write loses.
	r.Client.Set(ctx, nf, "1", time.Minute)
	if ok, err := rediswrite.Write(ctx, r.Client, r.Names, snapshottest.Snapshot(t, id, "t1", "QUEUED", 2), 0, "", nil); err != nil || ok {
		t.Fatalf("Write older = %v, %v", ok, err)
	}
	if n := r.Client.Exists(ctx, nf).Val(); n != 0 {
		t.Errorf("negative-cache key survived a write of an older version")
	}
}

func TestWritePublishesOnlyWhenWritten(t *testing.T) {
	t.Parallel()
	r := testenv.SharedRedis(t)
	ctx := testenv.Context(t)
	id := testenv.UniqueID("task")
	channel := r.Names.Channel("t1")

	sub := r.Client.Subscribe(ctx, channel)
	t.Cleanup(func() { sub.Close() })
	if _, err := sub.Receive(ctx); err != nil { // the subscription confirmation
		t.Fatalf("subscribe: %v", err)
	}
	write := func(v int64, msg string) bool {
		t.Helper()
		ok, err := rediswrite.Write(ctx, r.Client, r.Names, snapshottest.Snapshot(t, id, "t1", "RUNNING", v), 0, channel, []byte(msg))
		if err != nil {
			t.Fatalf("Write v%d: %v", v, err)
		}
		return ok
	}
	if !write(2, "v2") {
		t.Fatal("first write did not write")
	}
	if write(1, "v1") || write(2, "v2-again") {
		t.Fatal("a stale write wrote")
	}
	if !write(3, "v3") {
		t.Fatal("newer write did not write")
	}
	// Messages arrive in publish order, so had v1 or v2-again been published
	// they would come between v2 and v3.
	for _, want := range []string{"v2", "v3"} {
		msg, err := sub.ReceiveMessage(ctx)
		if err != nil {
			t.Fatalf("receive: %v", err)
		}
		if msg.Payload != want {
			t.Fatalf("received %q, want %q", msg.Payload, want)
		}
	}
}

func TestWriteTTLByStatus(t *testing.T) {
	t.Parallel()
	r := testenv.SharedRedis(t)
	ctx := testenv.Context(t)
	for _, status := range []string{"QUEUED", "RUNNING", "PROVIDER_SUBMITTED", "POST_PROCESSING", "SUCCEEDED", "FAILED", "CANCELED", "SOMETHING_NEW"} {
		id := testenv.UniqueID("task")
		if _, err := rediswrite.Write(ctx, r.Client, r.Names, snapshottest.Snapshot(t, id, "t1", status, 1), 0, "", nil); err != nil {
			t.Fatal(err)
		}
		pttl := r.Client.PTTL(ctx, r.Names.Snapshot(id)).Val()
		base := snapshot.TTL(status)
		// PTTL counts down from the moment of the write, so allow a little
		// below the base; the script cannot run for a second.
		if pttl < base-time.Second || pttl > base+base/10 {
			t.Errorf("%s: PTTL %v, want within [%v, %v]", status, pttl, base, base+base/10)
		}
	}
	// An explicit ttl wins.
	id := testenv.UniqueID("task")
	if _, err := rediswrite.Write(ctx, r.Client, r.Names, snapshottest.Snapshot(t, id, "t1", "SUCCEEDED", 1), 5*time.Minute, "", nil); err != nil {
		t.Fatal(err)
	}
	if pttl := r.Client.PTTL(ctx, r.Names.Snapshot(id)).Val(); pttl <= 4*time.Minute || pttl > 5*time.Minute {
		t.Errorf("explicit ttl: PTTL %v, want about 5m", pttl)
	}
}

func TestWriteStoresDocumentVerbatim(t *testing.T) {
	t.Parallel()
	r := testenv.SharedRedis(t)
	ctx := testenv.Context(t)
	id := testenv.UniqueID("task")
	in := []byte(`{"task_id":"` + id + `","tenant_id":"t1","version":1,"status":"QUEUED","future_field":{"a":[1,2]}}`)
	s := snapshottest.MustParse(t, in)
	if _, err := rediswrite.Write(ctx, r.Client, r.Names, s, 0, "", nil); err != nil {
		t.Fatal(err)
	}
	if got := r.Client.Get(ctx, r.Names.Snapshot(id)).Val(); got != string(in) {
		t.Errorf("stored %s, want %s", got, in)
	}
}

func TestWriteRedisError(t *testing.T) {
	t.Parallel()
	srv := testenv.StartRedis(t)
	c := srv.Client()
	srv.Stop()
	ctx, cancel := context.WithTimeout(testenv.Context(t), 5*time.Second)
	defer cancel()
	ok, err := rediswrite.Write(ctx, c, keys.Names{}, snapshottest.Snapshot(t, "x", "t1", "QUEUED", 1), 0, "", nil)
	if err == nil || ok {
		t.Fatalf("Write to a stopped Redis = %v, %v; want an error", ok, err)
	}
	if _, err := rediswrite.Write(ctx, c, keys.Names{}, nil, 0, "", nil); err == nil {
		t.Fatal("Write(nil) succeeded")
	}
}
