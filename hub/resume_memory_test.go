//go:build !race

// The race detector changes what allocates and how big objects are, so
// memory guards run without it: scripts/test runs them in a step of their
// own.

package hub

import (
	"context"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/pushd/pushd/snapshot"
)

// TestResumeRecordMemory bounds what a connection resumed from a stream
// cursor keeps to know the versions its client holds: one record per task
// it covers that changed shortly before the cursor, the record a new
// connection keeps of each task it was sent. Measured against connections
// resumed alike whose stream held nothing before the cursor.
func TestResumeRecordMemory(t *testing.T) {
	const conns = 2000
	for _, tasks := range []int{1, 20} {
		empty := resumedHeap(t, conns, tasks, false)
		held := resumedHeap(t, conns, tasks, true)
		per := (held - empty) / conns / int64(tasks)
		t.Logf("%d tasks a connection: %d bytes a connection resumed with nothing held, %d more a task held",
			tasks, empty/conns, per)
		if per > 112 {
			t.Errorf("%d bytes per task a resumed connection holds, want at most 112: a tracked entry (48) and its slot, as a new connection keeps per task sent", per)
		}
	}
}

// resumedHeap opens conns connections that each resume watching tasks
// tasks by id, whose stream holds a change of each before the cursor when
// held, and returns the heap they keep.
func resumedHeap(t *testing.T, conns, tasks int, held bool) int64 {
	h := New(Config{Source: snapshot.NewMemoryStore(), Bus: noBus{}, Stream: heldStream{held: held}})
	defer h.Close()
	subs := make([]Subscription, conns)
	for i := range subs {
		ids := make([]string, tasks)
		for j := range ids {
			ids[j] = "task_" + strconv.Itoa(i) + "_" + strconv.Itoa(j)
		}
		subs[i] = Subscription{Tasks: ids, Resume: strings.Join(ids, ","), Cursors: true}
	}
	before := heapInUse()
	opened := make([]*Conn, conns)
	for i := range opened {
		// A user each, as browsers are: one user's read budget would
		// refuse most of these subscriptions.
		c, err := h.Open(Principal{TenantID: "t1", UserID: "u" + strconv.Itoa(i), Grant: &snapshot.Grant{All: true}}, quietSink{})
		if err != nil {
			t.Fatal(err)
		}
		if rej, err := c.Subscribe(context.Background(), subs[i]); err != nil || len(rej) > 0 {
			t.Fatalf("subscribe: %v %v", rej, err)
		}
		opened[i] = c
	}
	n := heapInUse() - before
	runtime.KeepAlive(opened)
	runtime.KeepAlive(subs)
	for _, c := range opened {
		c.Close()
	}
	return n
}

// heldStream replays a cursor that lists the ids it covers: nothing after
// it, and, when held, a change of each shortly before it.
type heldStream struct{ held bool }

func (heldStream) Covers(string) bool     { return true }
func (heldStream) CoversAll() bool        { return true }
func (heldStream) Position(string) string { return "" }
func (s heldStream) Replay(_ context.Context, tenant, cursor string, _ time.Duration) (after, before []snapshot.Notification, fallback string) {
	if !s.held {
		return nil, nil, ""
	}
	for id := range strings.SplitSeq(cursor, ",") {
		// Decoded from Redis's reply, each id is a string of its own.
		before = append(before, snapshot.Notification{TenantID: tenant, TaskID: strings.Clone(id), Version: 3})
	}
	return nil, before, ""
}

type noBus struct{}

func (noBus) Subscribe(context.Context, string) (func(), error) { return func() {}, nil }

type quietSink struct{}

func (quietSink) Bind(*Conn)                  {}
func (quietSink) Write([]Event) (bool, error) { return false, nil }
func (quietSink) Closed(CloseReason)          {}
