package hub_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/pushd/pushd/hub"
	"github.com/pushd/pushd/snapshot"
)

// fakeStream is a hub.Stream the test steers.
type fakeStream struct {
	mu       sync.Mutex
	position string
	covers   bool
	changes  []snapshot.Notification
	held     []snapshot.Notification
	fallback string
}

func (s *fakeStream) Covers(string) bool { s.mu.Lock(); defer s.mu.Unlock(); return s.covers }
func (s *fakeStream) CoversAll() bool    { return s.Covers("") }
func (s *fakeStream) Position(string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.position
}
func (s *fakeStream) Replay(context.Context, string, string, time.Duration) (after, before []snapshot.Notification, fallback string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.changes, s.held, s.fallback
}

// The initial state carries no stream position; a sync event with it
// follows, and later task events carry the position read before their take.
func TestStreamPositionsFollowTheInitialState(t *testing.T) {
	st := &fakeStream{position: "P1"}
	e := newEnv(t, hub.Config{Stream: st})
	e.publish(t, snap(t, "t1", "task_a", 1))
	_, r, _ := e.open(t, "t1", "u1", hub.Subscription{Tasks: []string{"task_a"}, Cursors: true})
	first := r.next(t)
	if first.Kind != hub.KindTask || first.Cursor != "" {
		// The writer may take the task only after settle; then the task
		// itself carries the position and no sync follows.
		if first.Kind != hub.KindTask || first.Cursor != "P1" {
			t.Fatalf("first event %+v", first)
		}
	} else if sync := r.next(t); sync.Kind != hub.KindSync || sync.Cursor != "P1" {
		t.Fatalf("after the initial state: %+v, want a sync with P1", sync)
	}
	st.mu.Lock()
	st.position = "P2"
	st.mu.Unlock()
	e.publish(t, snap(t, "t1", "task_a", 2))
	if ev := r.next(t); ev.Kind != hub.KindTask || ev.Snapshot.Version != 2 || ev.Cursor != "P2" {
		t.Fatalf("next event %+v, want task v2 with P2", ev)
	}
}

// A resume reads only the watched tasks the replay names, and a Resync the
// stream covers re-reads nothing.
func TestResumeReadsOnlyWhatMovedAndCoveredResyncReadsNothing(t *testing.T) {
	st := &fakeStream{position: "P", covers: true, changes: []snapshot.Notification{
		{TenantID: "t1", TaskID: "task_b", Version: 4, ProjectID: "p1", UserID: "u1"},
		{TenantID: "t1", TaskID: "task_z", Version: 9, ProjectID: "p9", UserID: "u9"}, // not watched
	}}
	e := newEnv(t, hub.Config{Stream: st})
	for _, id := range []string{"task_a", "task_b", "task_z"} {
		e.publish(t, snap(t, "t1", id, 4))
	}
	_, r, _ := e.open(t, "t1", "u1", hub.Subscription{Tasks: []string{"task_a", "task_b"}, Resume: "c", Cursors: true})
	ev := r.next(t)
	if ev.Kind != hub.KindTask || ev.Snapshot.TaskID != "task_b" {
		t.Fatalf("resume sent %+v first, want task_b", ev)
	}
	if ev.Cursor != "P" { // taken before the replay settled: a sync follows
		if ev := r.next(t); ev.Kind != hub.KindSync || ev.Cursor != "P" {
			t.Fatalf("then %+v, want the sync", ev)
		}
	}
	s := e.hub.Stats()
	if s.Resumes != 1 || s.ResumeTasks != 1 || e.store.gets.Load() != 0 {
		t.Fatalf("resumes %d, tasks %d, single reads %d", s.Resumes, s.ResumeTasks, e.store.gets.Load())
	}
	e.hub.Resync("t1")
	s = e.hub.Stats()
	if s.CatchUps != 1 || s.Resyncs != 0 {
		t.Fatalf("covered resync: catch-ups %d, resyncs %d", s.CatchUps, s.Resyncs)
	}

	// A fallback reads everything, as for a new client.
	st.mu.Lock()
	st.fallback = "epoch"
	st.mu.Unlock()
	_, r2, _ := e.open(t, "t1", "u1", hub.Subscription{Tasks: []string{"task_a", "task_b"}, Resume: "c", Cursors: true})
	got := map[string]bool{}
	for len(got) < 2 {
		if ev := r2.next(t); ev.Kind == hub.KindTask {
			got[ev.Snapshot.TaskID] = true
		}
	}
	if s := e.hub.Stats(); s.ResumeFallbacks != 1 {
		t.Fatalf("fallbacks %d", s.ResumeFallbacks)
	}
}

// askedStream is a fakeStream that tells each time its Position is asked.
type askedStream struct {
	fakeStream
	asked chan struct{} // cap 1
}

func (s *askedStream) Position(tenant string) string {
	select {
	case s.asked <- struct{}{}:
	default:
	}
	return s.fakeStream.Position(tenant)
}

// A connection whose initial state was offered before the stream had a
// position gets its sync once there is one, not at its next unrelated
// write (a heartbeat, many seconds away).
func TestSyncWaitsForThePositionNotForTheNextWrite(t *testing.T) {
	st := &askedStream{asked: make(chan struct{}, 1)}
	e := newEnv(t, hub.Config{Stream: st, HeartbeatInterval: time.Hour})
	e.publish(t, snap(t, "t1", "task_a", 1))
	_, r, _ := e.open(t, "t1", "u1", hub.Subscription{Tasks: []string{"task_a"}, Cursors: true})
	if ev := r.next(t); ev.Kind != hub.KindTask || ev.Cursor != "" {
		t.Fatalf("first event %+v, want the task without a position", ev)
	}
	<-st.asked // the take after the initial state found no position
	st.mu.Lock()
	st.position = "P1"
	st.mu.Unlock()
	if ev := r.next(t); ev.Kind != hub.KindSync || ev.Cursor != "P1" {
		t.Fatalf("then %+v, want a sync with P1", ev)
	}
}

// A resume whose replay finds nothing to send settles while the hello may
// still be being written: the writer of the hello takes the sync after it.
func TestSyncAfterAResumeSettledDuringAWrite(t *testing.T) {
	st := &fakeStream{position: "P"}
	e := newEnv(t, hub.Config{Stream: st, HeartbeatInterval: time.Hour})
	e.publish(t, snap(t, "t1", "task_a", 1))
	r := newRecorder()
	gate := make(chan struct{})
	r.gate, r.entered = gate, make(chan struct{}, 8)
	c, err := e.hub.Open(hub.Principal{TenantID: "t1", UserID: "u1"}, r)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	<-r.entered // the hello's write has begun and waits
	if _, err := c.Subscribe(context.Background(), hub.Subscription{Tasks: []string{"task_a"}, Resume: "c", Cursors: true}); err != nil {
		t.Fatal(err)
	}
	close(gate)
	if ev := r.next(t); ev.Kind != hub.KindSync || ev.Cursor != "P" {
		t.Fatalf("after the resume: %+v, want a sync with P", ev)
	}
}
