package rediswrite_test

import (
	"strconv"
	"strings"
	"testing"

	"github.com/pushd/pushd/internal/testenv"
	"github.com/pushd/pushd/snapshot/rediswrite"
	"github.com/pushd/pushd/snapshot/snapshottest"
)

// WriteStream appends one entry per version that moved, in the round trip
// that stores and publishes it, with the fields of docs/DESIGN.md,
// "Streams and their epoch"; a stale version appends nothing, and the
// stream's creation records its epoch.
func TestWriteStreamAppendsOnlyWhatItWrote(t *testing.T) {
	t.Parallel()
	r := testenv.SharedRedis(t)
	ctx := testenv.Context(t)
	tenant := testenv.UniqueID("tenant")
	id := testenv.UniqueID("task")
	channel := r.Names.Channel(tenant)
	stream := r.Names.Stream(tenant)

	sub := r.Client.Subscribe(ctx, channel)
	t.Cleanup(func() { sub.Close() })
	if _, err := sub.Receive(ctx); err != nil {
		t.Fatalf("subscribe: %v", err)
	}
	for _, step := range []struct {
		version int64
		written bool
	}{{2, true}, {1, false}, {2, false}, {5, true}, {4, false}} {
		ok, err := rediswrite.WriteStream(ctx, r.Client, r.Names, snapshottest.Snapshot(t, id, tenant, "RUNNING", step.version), 0, channel, []byte("v"+strconv.FormatInt(step.version, 10)), 1000)
		if err != nil || ok != step.written {
			t.Fatalf("WriteStream v%d = %v, %v; want %v", step.version, ok, err, step.written)
		}
	}
	entries, err := r.Client.XRange(ctx, stream, "-", "+").Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 2 {
		t.Fatalf("stream holds %d entries, want 2 (v2 and v5): %v", len(entries), entries)
	}
	for i, v := range []string{"2", "5"} {
		want := map[string]any{"task_id": id, "version": v, "event_type": rediswrite.EventChanged,
			"project_id": "p1", "user_id": "u1", "occurred_at": "1710000000000"}
		got := entries[i].Values
		if len(got) != len(want) {
			t.Fatalf("entry %d fields %v, want %v", i, got, want)
		}
		for k, wv := range want {
			if got[k] != wv {
				t.Fatalf("entry %d field %s = %v, want %v", i, k, got[k], wv)
			}
		}
	}
	// The notifications are those of the writes, in the stream's order.
	for _, want := range []string{"v2", "v5"} {
		msg, err := sub.ReceiveMessage(ctx)
		if err != nil || msg.Payload != want {
			t.Fatalf("received %v, %v; want %q", msg, err, want)
		}
	}
	epoch, err := r.Client.Get(ctx, r.Names.StreamEpoch(tenant)).Result()
	if err != nil || epoch != entries[0].ID {
		t.Fatalf("epoch %q, %v; want the first entry's id %s", epoch, err, entries[0].ID)
	}

	// A stream Redis lost is a new incarnation with a new epoch.
	if err := r.Client.Del(ctx, stream).Err(); err != nil {
		t.Fatal(err)
	}
	if ok, err := rediswrite.WriteStream(ctx, r.Client, r.Names, snapshottest.Snapshot(t, id, tenant, "RUNNING", 6), 0, "", nil, 1000); err != nil || !ok {
		t.Fatalf("WriteStream v6 = %v, %v", ok, err)
	}
	again, _ := r.Client.XRange(ctx, stream, "-", "+").Result()
	if len(again) != 1 {
		t.Fatalf("recreated stream holds %d entries, want 1", len(again))
	}
	if epoch2 := r.Client.Get(ctx, r.Names.StreamEpoch(tenant)).Val(); epoch2 != again[0].ID || epoch2 == epoch {
		t.Fatalf("epoch after recreation %q, want %s (not the old %s)", epoch2, again[0].ID, epoch)
	}
}

// Write without a stream touches no stream.
func TestWriteWithoutStreamAppendsNothing(t *testing.T) {
	t.Parallel()
	r := testenv.SharedRedis(t)
	ctx := testenv.Context(t)
	tenant := testenv.UniqueID("tenant")
	if _, err := rediswrite.Write(ctx, r.Client, r.Names, snapshottest.Snapshot(t, testenv.UniqueID("task"), tenant, "RUNNING", 1), 0, "", nil); err != nil {
		t.Fatal(err)
	}
	if n := r.Client.Exists(ctx, r.Names.Stream(tenant), r.Names.StreamEpoch(tenant)).Val(); n != 0 {
		t.Fatalf("%d stream keys exist after a write without a stream", n)
	}
}

// A stream lost and recreated at once, many times over, gets a new epoch
// each time, even when the new incarnation begins within the millisecond
// the old one did and so would get its first id.
func TestRecreatedStreamAlwaysGetsANewEpoch(t *testing.T) {
	t.Parallel()
	r := testenv.SharedRedis(t)
	ctx := testenv.Context(t)
	tenant := testenv.UniqueID("tenant")
	id := testenv.UniqueID("task")
	stream, epochKey := r.Names.Stream(tenant), r.Names.StreamEpoch(tenant)
	const rounds = 300
	prev := ""
	sameMS := 0
	for v := int64(1); v <= rounds; v++ {
		if err := r.Client.Del(ctx, stream).Err(); err != nil {
			t.Fatal(err)
		}
		if ok, err := rediswrite.WriteStream(ctx, r.Client, r.Names, snapshottest.Snapshot(t, id, tenant, "RUNNING", v), 0, "", nil, 1000); err != nil || !ok {
			t.Fatalf("WriteStream v%d = %v, %v", v, ok, err)
		}
		entries, err := r.Client.XRange(ctx, stream, "-", "+").Result()
		if err != nil || len(entries) != 1 {
			t.Fatalf("v%d: stream holds %v (%v), want one entry", v, entries, err)
		}
		epoch := r.Client.Get(ctx, epochKey).Val()
		if epoch != entries[0].ID || epoch == prev {
			t.Fatalf("v%d: epoch %q, first id %s, previous epoch %q: want the first id, new", v, epoch, entries[0].ID, prev)
		}
		if prevMS, _, _ := strings.Cut(prev, "-"); prev != "" && strings.HasPrefix(epoch, prevMS+"-") {
			sameMS++
		}
		prev = epoch
	}
	t.Logf("%d of %d incarnations began in the millisecond of the one before", sameMS, rounds)
}
