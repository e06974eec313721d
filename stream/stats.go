package stream

import (
	"sync/atomic"
	"time"

	"github.com/pushd/pushd/internal/histogram"
)

// Reasons a resume cursor is not replayed (the client is then sent
// everything), the keys of Stats.ResumeFallbacks.
const (
	FallbackCorrupt     = "corrupt"     // not a cursor this node can decode
	FallbackTenant      = "tenant"      // a cursor of another tenant's stream
	FallbackEpoch       = "epoch"       // the stream was recreated (Redis lost it) or is gone
	FallbackTrimmed     = "trimmed"     // entries after the cursor were trimmed away
	FallbackTooMany     = "too_many"    // more entries after the cursor than Config.MaxReplay
	FallbackAhead       = "ahead"       // a cursor past the stream's last entry: forged, or of a lost stream
	FallbackUnavailable = "unavailable" // Redis did not answer
)

// Reasons the tail of a tenant is restarted with a re-read of the tenant,
// the keys of Stats.TailResyncs.
const (
	ResyncTrimmed   = "trimmed"   // entries after the tail's last id were trimmed before it read them
	ResyncEpoch     = "epoch"     // the stream was recreated: its epoch changed
	ResyncBackwards = "backwards" // the stream is missing, or its last id is before the tail's
	ResyncStart     = "start"     // the tail could not be placed when the tenant was first watched
)

var (
	fallbackReasons = [...]string{FallbackCorrupt, FallbackTenant, FallbackEpoch, FallbackTrimmed, FallbackTooMany, FallbackAhead, FallbackUnavailable}
	resyncReasons   = [...]string{ResyncTrimmed, ResyncEpoch, ResyncBackwards, ResyncStart}
)

// lagBounds bound the lag between an entry's append (its id's time, in
// milliseconds) and its delivery to the hub.
var lagBounds = [...]time.Duration{
	time.Millisecond, 2500 * time.Microsecond, 5 * time.Millisecond, 10 * time.Millisecond,
	25 * time.Millisecond, 50 * time.Millisecond, 100 * time.Millisecond, 250 * time.Millisecond,
	500 * time.Millisecond, time.Second, 2500 * time.Millisecond, 5 * time.Second, 10 * time.Second,
}

type counters struct {
	reads, readErrors, entries, applyErrors, malformed atomic.Int64
	rechecks                                           atomic.Int64
	replays, replayed, replayedHeld                    atomic.Int64
	fallbacks                                          [len(fallbackReasons)]atomic.Int64
	resyncs                                            [len(resyncReasons)]atomic.Int64
	lag                                                *histogram.Histogram
}

func newCounters() *counters {
	return &counters{lag: histogram.New(lagBounds[:]...)}
}

// Stats are a Tailer's counters since it was made, and its gauges now.
type Stats struct {
	Tailed      int   // streams tailed now
	Polled      int   // of those, on a cluster, read by polling once per Block: their master has Config.ClusterReads blocking reads already
	Length      int64 // sum of their lengths (XLEN), as of the last check
	MaxLength   int64 // the longest of them, as of the last check
	Reads       int64 // XREAD calls (on a cluster, blocking reads and polls) that answered
	ReadErrors  int64 // XREAD calls (on a cluster, rounds) that failed
	Rechecks    int64 // times a reader checked its tails again before reading on: a read failed, or ran on a connection new since the last check
	Entries     int64 // entries read and delivered to the hub
	Malformed   int64 // entries skipped: no valid task_id or version
	ApplyErrors int64 // batches the hub could not deliver (retried)

	Replays         int64            // resume cursors replayed
	Replayed        int64            // entries after the cursors those replays returned
	ReplayedHeld    int64            // entries at or before the cursors, within the window asked for, those replays returned
	ResumeFallbacks map[string]int64 // resume cursors not replayed, by reason (Fallback*)
	TailResyncs     map[string]int64 // tenants re-read because the tail could not continue, by reason (Resync*)

	Lag histogram.Snapshot // time from an entry's append to its delivery to the hub, per entry
}

func (c *counters) stats() Stats {
	s := Stats{
		Reads: c.reads.Load(), ReadErrors: c.readErrors.Load(), Rechecks: c.rechecks.Load(), Entries: c.entries.Load(),
		Malformed: c.malformed.Load(), ApplyErrors: c.applyErrors.Load(),
		Replays: c.replays.Load(), Replayed: c.replayed.Load(), ReplayedHeld: c.replayedHeld.Load(),
		ResumeFallbacks: make(map[string]int64, len(fallbackReasons)),
		TailResyncs:     make(map[string]int64, len(resyncReasons)),
		Lag:             c.lag.Snapshot(),
	}
	for i, r := range fallbackReasons {
		s.ResumeFallbacks[r] = c.fallbacks[i].Load()
	}
	for i, r := range resyncReasons {
		s.TailResyncs[r] = c.resyncs[i].Load()
	}
	return s
}

func (c *counters) fallback(reason string) {
	for i, r := range fallbackReasons {
		if r == reason {
			c.fallbacks[i].Add(1)
		}
	}
}

func (c *counters) resync(reason string) {
	for i, r := range resyncReasons {
		if r == reason {
			c.resyncs[i].Add(1)
		}
	}
}
