package testenv

import (
	"context"
	"fmt"
	"testing"
	"time"
)

// Wait is how long Eventually waits for a condition.
const Wait = 10 * time.Second

// Eventually polls cond, the state of what a test runs, until it holds,
// and fails the test naming what did not happen within Wait. It is for
// state with nothing to wait on (a counter, a gauge, a key in Redis).
func Eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	EventuallyWithin(t, what, Wait, cond)
}

// EventuallyWithin is Eventually with a deadline of its own.
func EventuallyWithin(t testing.TB, what string, within time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, within)
		}
		time.Sleep(10 * time.Millisecond) // polling a condition, with a deadline
	}
}

// Retry calls try until it returns nil or ctx ends, and then returns nil,
// or ctx's error with try's last. It is for a call that fails for a while
// on its own and then succeeds (a write while Redis Cluster fails over).
func Retry(ctx context.Context, try func() error) error {
	for {
		err := try()
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (last: %v)", ctx.Err(), err)
		case <-time.After(50 * time.Millisecond): // the call's own state, with a deadline
		}
	}
}
