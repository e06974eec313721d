package store

import (
	"fmt"
	"testing"
	"time"

	"github.com/pushd/pushd/snapshot"
)

// An expired snapshot leaves its version behind, not its document: a read
// older than that version is answered as read and not cached, a newer one
// is cached.
func TestRememberAfterExpiryKeepsOnlyTheVersion(t *testing.T) {
	s := New(Config{})
	at := func(v int64) *snapshot.Snapshot {
		t.Helper()
		snap, err := snapshot.Parse(fmt.Appendf(nil, `{"task_id":"task_1","tenant_id":"t1","status":"RUNNING","version":%d}`, v))
		if err != nil {
			t.Fatal(err)
		}
		return snap
	}
	v3, v5, v6 := at(3), at(5), at(6)
	if got := s.remember(v5); got != v5 {
		t.Fatalf("remember(v5) = v%d", got.Version)
	}
	if got := s.remember(v3); got != v5 {
		t.Fatalf("remember(v3) beside a cached v5 = v%d, want v5", got.Version)
	}
	s.tasks.sweepAt(monotime() + int64(time.Hour))
	if s.Cached("task_1") != nil {
		t.Fatal("an expired snapshot is still served")
	}
	if got := s.remember(v3); got != v3 {
		t.Fatalf("remember(v3) beside the remnant of v5 = %+v, want v3 as read", got)
	}
	if s.Cached("task_1") != nil {
		t.Fatal("a read older than the remnant was cached")
	}
	s.tasks.update("task_1", func(old *snapshot.Snapshot, present bool) (*snapshot.Snapshot, bool) {
		if !present || old.Version != 5 || old.JSON() != nil {
			t.Errorf("the cache holds %+v, %v; want the version 5 without its document", old, present)
		}
		return old, false
	})
	if got := s.remember(v6); got != v6 {
		t.Fatalf("remember(v6) = v%d", got.Version)
	}
	if snap, err := s.Get(t.Context(), "task_1", 6); err != nil || snap != v6 {
		t.Fatalf("Get after v6 = %v, %v; want v6 from the cache", snap, err)
	}
}
