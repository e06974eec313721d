package node

import "time"

// TestTuning is what operators never set and no Config holds: intervals
// that tests shorten so that a failure, a cleanup or a demo task shows
// within a test's time. Each zero means the component's default.
type TestTuning struct {
	// LivenessInterval is how often the bus checks its subscription by
	// publishing to itself (the bus's default: 1s).
	LivenessInterval time.Duration
	// SnapshotFetchTimeout bounds one snapshot read, a quarter of it for
	// Redis and the rest for PostgreSQL (the store's default: 3s).
	SnapshotFetchTimeout time.Duration
	// DemoStep is the demo simulator's time between two states of a task.
	DemoStep time.Duration
	// NoRepair runs no repair rounds: a test that counts every read the
	// node makes would otherwise find a round's reads among them now and
	// then.
	NoRepair bool
}

// An Option changes a node for a test; ForTest makes them. A deployment
// passes none.
type Option func(*TestTuning)

// ForTest sets t's non-zero fields; later options win.
func ForTest(t TestTuning) Option {
	return func(to *TestTuning) {
		if t.LivenessInterval != 0 {
			to.LivenessInterval = t.LivenessInterval
		}
		if t.SnapshotFetchTimeout != 0 {
			to.SnapshotFetchTimeout = t.SnapshotFetchTimeout
		}
		if t.DemoStep != 0 {
			to.DemoStep = t.DemoStep
		}
		to.NoRepair = to.NoRepair || t.NoRepair
	}
}
