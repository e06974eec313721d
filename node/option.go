package node

import "time"

// An Option sets what operators never do and no Config holds: intervals
// that tests shorten so that a failure, a cleanup or a demo task shows
// within a test's time. Each zero means the component's default.
type Option func(*tuning)

type tuning struct {
	livenessInterval     time.Duration
	snapshotFetchTimeout time.Duration
	demoStep             time.Duration
	noRepair             bool
}

// WithLivenessInterval is how often the bus checks its subscription by
// publishing to itself (the bus's default: 1s).
func WithLivenessInterval(d time.Duration) Option {
	return func(t *tuning) { t.livenessInterval = d }
}

// WithSnapshotFetchTimeout bounds one snapshot read, a quarter of it for
// Redis and the rest for PostgreSQL (the store's default: 3s).
func WithSnapshotFetchTimeout(d time.Duration) Option {
	return func(t *tuning) { t.snapshotFetchTimeout = d }
}

// WithDemoStep is the demo simulator's time between two states of a task.
func WithDemoStep(d time.Duration) Option {
	return func(t *tuning) { t.demoStep = d }
}

// WithoutRepair runs no repair rounds: a test that counts every read the
// node makes would otherwise find a round's reads among them now and then.
func WithoutRepair() Option {
	return func(t *tuning) { t.noRepair = true }
}
