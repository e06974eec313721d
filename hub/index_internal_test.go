package hub

import (
	"testing"
	"time"
)

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
