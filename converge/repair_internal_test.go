package converge

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
