package hub

import (
	"testing"
	"time"
)

// Rounds start on the interval's multiples of the wall clock, the same on
// every node; failed rounds in a row double the wait, up to 8 intervals.
func TestNextRepairSlot(t *testing.T) {
	const interval = 10 * time.Second
	now := time.Date(2026, 12, 2, 10, 0, 3, 0, time.UTC)
	for _, c := range []struct {
		failures int
		want     time.Duration // after 10:00:00
	}{
		{0, 10 * time.Second}, {1, 20 * time.Second}, {2, 40 * time.Second}, {3, 80 * time.Second}, {9, 80 * time.Second},
	} {
		if got := nextRepairSlot(now, interval, c.failures).Sub(now.Truncate(interval)); got != c.want {
			t.Errorf("after %d failures the next round starts %v after the slot, want %v", c.failures, got, c.want)
		}
	}
	other := now.Add(4 * time.Second) // another node, later in the same interval
	if a, b := nextRepairSlot(now, interval, 0), nextRepairSlot(other, interval, 0); !a.Equal(b) {
		t.Errorf("two nodes in one interval start their next rounds at %v and %v", a, b)
	}
}

// The index knows since when each project and user scope is watched, from
// its first watcher while any watches it: a scope's first listing reaches
// back to there. The same id as a project and as a user are two scopes.
func TestScopesCarryTheirWatchTime(t *testing.T) {
	var x index
	x.init(1000)
	a, b := &Conn{}, &Conn{}
	k := key{tenant: "t1", id: "x"}
	before := time.Now().UnixMilli()
	x.add(byProject, k, a)
	since := x.scopes()[0].WatchedSince
	if since < before || since > time.Now().UnixMilli() {
		t.Fatalf("project watched since %d, want between %d and now", since, before)
	}
	// A second watcher and the same id as a user scope leave the
	// project's time as it was.
	for time.Now().UnixMilli() == since {
		time.Sleep(time.Millisecond) // a later millisecond, not synchronization
	}
	x.add(byProject, k, b)
	x.add(byUser, k, b)
	x.remove(byProject, k, a)
	for _, sc := range x.scopes() {
		if sc.ProjectID == "x" && sc.WatchedSince != since {
			t.Errorf("project watched since %d after its first watcher left, want %d", sc.WatchedSince, since)
		}
		if sc.UserID == "x" && sc.WatchedSince <= since {
			t.Errorf("user scope watched since %d, want after the project's %d", sc.WatchedSince, since)
		}
	}
	x.remove(byProject, k, b)
	x.remove(byUser, k, b)
	if n := len(x.shard(k).since[byProject]) + len(x.shard(k).since[byUser]); n != 0 {
		t.Errorf("%d watch times kept after the last watcher left", n)
	}
}
