package hub_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/pushd/pushd/hub"
	"github.com/pushd/pushd/internal/testenv"
)

func TestHistogramsMeasureChangesNotInitialState(t *testing.T) {
	e := newEnv(t, hub.Config{})
	e.publish(t, snap(t, "t1", "task_a", 1))
	_, r, _ := e.open(t, "t1", "u1", hub.Subscription{Tasks: []string{"task_a"}})
	r.nextTask(t)
	e.publish(t, snap(t, "t1", "task_a", 2))
	r.nextTask(t)
	testenv.Eventually(t, "two task events counted", func() bool { return e.hub.Stats().Pushed[hub.TransportUnknown] == 2 })
	st := e.hub.Stats()
	// The initial state is in neither histogram; the change is in both.
	if n := st.NotifyToWrite.Count; n != 1 {
		t.Fatalf("notification-to-write observed %d times, want 1", n)
	}
	if n := st.Staleness.Count; n != 1 {
		t.Fatalf("staleness observed %d times, want 1", n)
	}
	// updated_at is in 2024: far past the last bucket.
	s := st.Staleness
	if s.Cumulative[len(s.Cumulative)-1] != 0 || s.Count != 1 || s.Sum < 24*time.Hour {
		t.Fatalf("staleness %+v: want one observation past every bound", s)
	}
}

// Plan labels come from the configured plans only: a plan a token names
// that is not one counts as other, however many there are.
func TestConnCountsByTransportAndConfiguredPlan(t *testing.T) {
	e := newEnv(t, hub.Config{Plans: []string{"free", "pro"}})
	open := func(tr hub.Transport, plan string) *hub.Conn {
		c, err := e.hub.Open(hub.Principal{TenantID: "t1", UserID: "u1", Transport: tr, Plan: plan}, newRecorder())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(c.Close)
		return c
	}
	open(hub.TransportSSE, "pro")
	open(hub.TransportSSE, "pro")
	ws := open(hub.TransportWebSocket, "")
	for i := range 20 {
		open(hub.TransportSSE, fmt.Sprintf("plan%d", i))
	}
	counts := map[string]int{}
	for _, cc := range e.hub.ConnCounts() {
		counts[cc.Transport.String()+"/"+cc.Plan] += cc.N
	}
	if counts["sse/pro"] != 2 || counts["websocket/none"] != 1 || counts["sse/other"] != 20 || len(counts) != 3 {
		t.Fatalf("counts %v, want sse/pro 2, websocket/none 1 and sse/other 20 alone", counts)
	}
	ws.Close()
	for _, cc := range e.hub.ConnCounts() {
		if cc.Transport == hub.TransportWebSocket {
			t.Fatalf("closed connection still counted: %+v", cc)
		}
	}
}
