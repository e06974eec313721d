package rediswrite_test

import (
	"os/exec"
	"strconv"
	"strings"
	"testing"

	"github.com/pushd/pushd/internal/testenv"
	"github.com/pushd/pushd/snapshot/snapshottest"
)

// A writer in a shell keeps the version rule by running the write script
// with redis-cli, as DESIGN's "By hand" shows: a version is stored and
// announced once, a repeat and an older one are neither, and the stored
// document is the newest.
func TestWriteScriptFromTheShell(t *testing.T) {
	t.Parallel()
	r := testenv.SharedRedis(t)
	ctx := testenv.Context(t)
	task, tenant := testenv.UniqueID("task"), testenv.UniqueID("t")
	channel := r.Names.Channel(tenant)
	sub := r.Client.Subscribe(ctx, channel)
	defer sub.Close()
	if _, err := sub.Receive(ctx); err != nil { // the subscription's confirmation
		t.Fatal(err)
	}
	hint := func(v int64) string {
		return `{"task_id":"` + task + `","version":` + strconv.FormatInt(v, 10) + `,"project_id":"p1","user_id":"u1"}`
	}
	for _, step := range []struct {
		version int64
		reply   string
	}{{18, "1"}, {18, "2"}, {17, "0"}, {19, "1"}} {
		v := strconv.FormatInt(step.version, 10)
		cmd := exec.CommandContext(ctx, "redis-cli", "-u", r.URL, "--eval", "setifnewer.lua",
			r.Names.Snapshot(task), r.Names.NotFound(task), r.Names.SnapshotMeta(task), ",",
			string(snapshottest.Doc(task, tenant, "RUNNING", step.version)), v, "10000", channel, hint(step.version), tenant)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("redis-cli --eval for version %s: %v: %s", v, err, out)
		}
		if got := strings.TrimSpace(string(out)); got != step.reply {
			t.Fatalf("version %s: replied %q, want %s", v, got, step.reply)
		}
	}
	if stored := snapshottest.MustParse(t, []byte(r.Client.Get(ctx, r.Names.Snapshot(task)).Val())); stored.Version != 19 {
		t.Fatalf("stored version %d, want 19", stored.Version)
	}
	// The hints in order; the marker published last proves none came between.
	if err := r.Client.Publish(ctx, channel, "end").Err(); err != nil {
		t.Fatal(err)
	}
	var heard []string
	for {
		m, err := sub.ReceiveMessage(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if m.Payload == "end" {
			break
		}
		heard = append(heard, m.Payload)
	}
	if want := []string{hint(18), hint(19)}; strings.Join(heard, "\n") != strings.Join(want, "\n") {
		t.Fatalf("heard %q, want %q", heard, want)
	}
}
