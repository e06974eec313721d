package node

import "time"

// An Option sets what operators never do: intervals that tests shorten
// so that a failure, a cleanup or a demo task shows within a test's time.
// Each zero means the component's default.
type Option func(*tuning)

type tuning struct {
	livenessInterval     time.Duration
	disconnectCheck      time.Duration
	snapshotFetchTimeout time.Duration
	demoStep             time.Duration
	announceGrace        time.Duration
	noRepair             bool
}

// WithLivenessInterval is how often the bus checks its subscription by
// publishing to itself (the bus's default: 1s).
func WithLivenessInterval(d time.Duration) Option {
	return func(t *tuning) { t.livenessInterval = d }
}

// WithDisconnectCheck is how often SSE connections held without a
// goroutine are checked for a client that went away (the SSE default: 5s).
func WithDisconnectCheck(d time.Duration) Option {
	return func(t *tuning) { t.disconnectCheck = d }
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

// WithAnnounceGrace is how old an entry of the unannounced journal must be
// before the node's reconcile looks at it (the reconciler's default: 2s).
func WithAnnounceGrace(d time.Duration) Option {
	return func(t *tuning) { t.announceGrace = d }
}
