package hub_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/pushd/pushd/hub"
	"github.com/pushd/pushd/snapshot"
)

func TestInspectTask(t *testing.T) {
	e := newEnv(t, hub.Config{})
	start := time.Now().Truncate(time.Second)
	e.publish(t, snap(t, "t1", "task_a", 1))
	e.publish(t, snap(t, "t1", "task_b", 1))
	byID, rID, _ := e.open(t, "t1", "u1", hub.Subscription{Tasks: []string{"task_a"}})
	byProject, rProject, _ := e.open(t, "t1", "u2", hub.Subscription{Projects: []string{"p1"}})
	both, rBoth, _ := e.open(t, "t1", "u1", hub.Subscription{Tasks: []string{"task_a"}, Projects: []string{"p1"}})
	_, rOther, _ := e.open(t, "t1", "u1", hub.Subscription{Tasks: []string{"task_b"}})
	for _, r := range []*recorder{rID, rProject, rProject, rBoth, rBoth, rOther} {
		r.nextTask(t) // task_a to each but the last, task_b to it and to the project's
	}
	e.publish(t, snap(t, "t1", "task_a", 2))
	for _, r := range []*recorder{rID, rProject, rBoth} {
		if got := r.nextTask(t); got.TaskID != "task_a" || got.Version != 2 {
			t.Fatalf("got %s v%d, want task_a v2", got.TaskID, got.Version)
		}
	}

	rep, err := e.hub.InspectTask(context.Background(), "task_a", 100)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Snapshot.Version != 2 || rep.Truncated != 0 || len(rep.Watchers) != 3 {
		t.Fatalf("report of v%d with %d watchers, %d truncated; want v2, 3, 0: %+v", rep.Snapshot.Version, len(rep.Watchers), rep.Truncated, rep.Watchers)
	}
	want := map[string][2]bool{byID.ID: {true, false}, byProject.ID: {false, true}, both.ID: {true, true}}
	for _, w := range rep.Watchers {
		how, ok := want[w.ConnID]
		if !ok {
			t.Fatalf("watcher %s listed: it does not watch task_a", w.ConnID)
		}
		delete(want, w.ConnID)
		if w.ByID != how[0] || w.ByProject != how[1] || w.ByUser || !w.Allowed || w.TenantID != "t1" {
			t.Errorf("watcher %+v, want by id %v, by project %v", w, how[0], how[1])
		}
		if w.Sent != 2 || w.Pending != 0 || w.SentAt.Before(start) || w.SentAt.After(time.Now()) {
			t.Errorf("watcher %s sent v%d at %v, %d pending; want v2 since %v, none pending", w.ConnID, w.Sent, w.SentAt, w.Pending, start)
		}
	}
	if rep.Hint.Version != 2 || rep.Hint.At.Before(start) {
		t.Errorf("hint %+v, want v2", rep.Hint)
	}
	if rep.Read.Version != 2 || rep.Read.Source != hub.ReadHint || rep.Read.Origin != snapshot.OriginMemory || rep.Read.At.Before(rep.Hint.At) {
		t.Errorf("read %+v, want v2 for the hint, from memory, after it", rep.Read)
	}

	// Past the limit: three connections are four index entries.
	rep, err = e.hub.InspectTask(context.Background(), "task_a", 1)
	if err != nil || len(rep.Watchers) != 1 || rep.Truncated != 3 {
		t.Errorf("limit 1: %d watchers, %d truncated, %v; want 1, 3", len(rep.Watchers), rep.Truncated, err)
	}

	// A task watched by scope only keeps no note; one nobody has is not found.
	if rep, err := e.hub.InspectTask(context.Background(), "task_b", 100); err != nil || len(rep.Watchers) != 3 {
		t.Errorf("task_b: %d watchers, %v; want 3 (by id, and two by project)", len(rep.Watchers), err)
	}
	if _, err := e.hub.InspectTask(context.Background(), "task_none", 100); !errors.Is(err, snapshot.ErrNotFound) {
		t.Errorf("unknown task: %v, want ErrNotFound", err)
	}
	if _, err := e.hub.InspectTask(context.Background(), "bad id", 100); !errors.Is(err, snapshot.ErrInvalidID) {
		t.Errorf("bad id: %v, want ErrInvalidID", err)
	}
	byID.Close()
	both.Close()
	byProject.Close()
	if rep, err := e.hub.InspectTask(context.Background(), "task_a", 100); err != nil || len(rep.Watchers) != 0 || rep.Hint.Version != 0 {
		t.Errorf("after the watchers left: %+v, %v; want none, and no note", rep, err)
	}
}
