package fanout

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pushd/pushd/internal/testenv"
	"github.com/pushd/pushd/snapshot"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// waitFor bounds every wait on an event. It is a deadline against a hang,
// not a claim about speed.
const waitFor = 15 * time.Second

// recorder is a Handler and LossHandler that hands what it hears to
// buffered channels. Its methods never block: past the buffer they count an
// overflow, which the test reports. events has every Lost ("lost"),
// Restored ("restored") and Resync ("resync:<tenant>") in the order of the
// calls.
type recorder struct {
	notes    chan snapshot.Notification
	resyncs  chan string
	lost     chan error
	restored chan struct{}
	events   chan string
	overflow atomic.Int64
}

func newRecorder(t *testing.T) *recorder {
	r := &recorder{
		notes:    make(chan snapshot.Notification, 4096),
		resyncs:  make(chan string, 4096),
		lost:     make(chan error, 64),
		restored: make(chan struct{}, 64),
		events:   make(chan string, 4096),
	}
	t.Cleanup(func() {
		if n := r.overflow.Load(); n > 0 {
			t.Errorf("recorder overflowed %d times", n)
		}
	})
	return r
}

// put sends v on ch without blocking, counting an overflow if ch is full.
func put[T any](r *recorder, ch chan<- T, v T) {
	select {
	case ch <- v:
	default:
		r.overflow.Add(1)
	}
}

func (r *recorder) Notify(n snapshot.Notification) { put(r, r.notes, n) }

func (r *recorder) Resync(tenantID string) {
	put(r, r.resyncs, tenantID)
	put(r, r.events, "resync:"+tenantID)
}

func (r *recorder) Lost(err error) {
	put(r, r.lost, err)
	put(r, r.events, "lost")
}

func (r *recorder) Restored() {
	put(r, r.restored, struct{}{})
	put(r, r.events, "restored")
}

// next returns the next value of ch, failing the test after waitFor.
func next[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	timer := time.NewTimer(waitFor)
	defer timer.Stop()
	select {
	case v := <-ch:
		return v
	case <-timer.C:
		var zero T
		t.Fatalf("no %s within %v", what, waitFor)
		return zero
	}
}

// none fails if ch holds a value now. It is for events that would already
// have happened synchronously, never for waiting.
func none[T any](t *testing.T, ch <-chan T, what string) {
	t.Helper()
	select {
	case v := <-ch:
		t.Fatalf("unexpected %s: %+v", what, v)
	default:
	}
}

func testContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	t.Cleanup(cancel)
	return ctx
}

func mustSubscribe(t *testing.T, b Bus, tenant string) func() {
	t.Helper()
	release, err := b.Subscribe(testContext(t), tenant)
	if err != nil {
		t.Fatalf("subscribe %s: %v", tenant, err)
	}
	return release
}

func closeBus(t *testing.T, b Bus) {
	t.Helper()
	if err := b.Close(); err != nil && !errors.Is(err, ErrClosed) {
		t.Errorf("close: %v", err)
	}
}
