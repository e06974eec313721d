package hub_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/pushd/pushd/hub"
	"github.com/pushd/pushd/snapshot"
)

// TestConnectionStateIsBounded: a user-scoped connection sees every task of
// its user, and a user may create tasks for as long as the connection
// lives. What it remembers per task stays within what it can watch at once
// (MaxSubscriptions + snapshot.MaxList), and every task still arrives.
func TestConnectionStateIsBounded(t *testing.T) {
	const maxSubs, tasks = 20, 2000
	e := newEnv(t, hub.Config{MaxSubscriptions: maxSubs})
	r := newRecorder()
	c, err := e.hub.Open(hub.Principal{TenantID: "t1", UserID: "u1"}, r)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Subscribe(context.Background(), hub.Subscription{User: true, Tasks: []string{"task_watched"}}); err != nil {
		t.Fatal(err)
	}
	e.publish(t, snap(t, "t1", "task_watched", 5))
	if v := r.nextTask(t).Version; v != 5 {
		t.Fatalf("watched task: version %d, want 5", v)
	}
	for i := range tasks {
		e.publish(t, snap(t, "t1", fmt.Sprintf("task_%04d", i), 1))
		if got := r.nextTask(t); got.Version != 1 {
			t.Fatalf("task %d: version %d", i, got.Version)
		}
	}
	if n, bound := hub.Remembered(c), maxSubs+snapshot.MaxList; n > bound {
		t.Fatalf("the connection remembers %d task versions after %d tasks, want at most %d", n, tasks, bound)
	}
}

// TestTasksWatchedByIDAreNeverForgotten: making room for the versions of
// other tasks forgets none of a task the connection watches by id, so a
// resend of what the client holds stays dropped however many tasks passed.
func TestTasksWatchedByIDAreNeverForgotten(t *testing.T) {
	const maxSubs, tasks = 10, 1000
	e := newEnv(t, hub.Config{MaxSubscriptions: maxSubs})
	e.publish(t, snap(t, "t1", "task_watched", 7))
	c, r, _ := e.open(t, "t1", "u1", hub.Subscription{User: true, Tasks: []string{"task_watched"}})
	if v := r.nextTask(t).Version; v != 7 {
		t.Fatalf("watched task: version %d, want 7", v)
	}
	for i := range tasks {
		e.publish(t, snap(t, "t1", fmt.Sprintf("task_%04d", i), 1))
		if got := r.nextTask(t); got.Version != 1 {
			t.Fatalf("task %d: version %d", i, got.Version)
		}
	}
	if v := hub.DeliveredVersion(c, "task_watched"); v != 7 {
		t.Fatalf("after %d other tasks, the watched task is remembered at version %d, want 7", tasks, v)
	}
}
