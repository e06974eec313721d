package stream

import (
	"sync/atomic"
	"time"
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

// LagBuckets are the upper bounds, in seconds, of the histogram of the lag
// between an entry's append (its id's time) and its delivery to the hub.
var LagBuckets = [...]float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10}

type counters struct {
	reads, readErrors, entries, applyErrors, malformed atomic.Int64
	rechecks                                           atomic.Int64
	replays, replayed                                  atomic.Int64
	fallbacks                                          [len(fallbackReasons)]atomic.Int64
	resyncs                                            [len(resyncReasons)]atomic.Int64
	lagCount                                           atomic.Int64
	lagSumMicros                                       atomic.Int64
	lagBuckets                                         [len(LagBuckets)]atomic.Int64 // not cumulative
}

func (c *counters) lag(d time.Duration) {
	d = max(d, 0)
	c.lagCount.Add(1)
	c.lagSumMicros.Add(d.Microseconds())
	s := d.Seconds()
	for i, b := range LagBuckets {
		if s <= b {
			c.lagBuckets[i].Add(1)
			return
		}
	}
}

// Stats are a Tailer's counters since it was made, and its gauges now.
type Stats struct {
	Tailed      int   // streams tailed now
	Length      int64 // sum of their lengths (XLEN), as of the last check
	MaxLength   int64 // the longest of them, as of the last check
	Reads       int64 // XREAD calls (on a cluster, pipelined rounds) that answered
	ReadErrors  int64 // XREAD calls (on a cluster, rounds) that failed
	Rechecks    int64 // times a reader checked its tails again before reading on: a read failed, or ran on a connection new since the last check
	Entries     int64 // entries read and delivered to the hub
	Malformed   int64 // entries skipped: no valid task_id or version
	ApplyErrors int64 // batches the hub could not deliver (retried)

	Replays         int64            // resume cursors replayed
	Replayed        int64            // entries those replays returned
	ResumeFallbacks map[string]int64 // resume cursors not replayed, by reason (Fallback*)
	TailResyncs     map[string]int64 // tenants re-read because the tail could not continue, by reason (Resync*)

	LagCount   int64         // entries whose lag was measured
	LagSum     time.Duration // their total lag
	LagBuckets []int64       // cumulative counts per LagBuckets bound
}

func (c *counters) stats() Stats {
	s := Stats{
		Reads: c.reads.Load(), ReadErrors: c.readErrors.Load(), Rechecks: c.rechecks.Load(), Entries: c.entries.Load(),
		Malformed: c.malformed.Load(), ApplyErrors: c.applyErrors.Load(),
		Replays: c.replays.Load(), Replayed: c.replayed.Load(),
		ResumeFallbacks: make(map[string]int64, len(fallbackReasons)),
		TailResyncs:     make(map[string]int64, len(resyncReasons)),
		LagCount:        c.lagCount.Load(),
		LagSum:          time.Duration(c.lagSumMicros.Load()) * time.Microsecond,
		LagBuckets:      make([]int64, len(LagBuckets)),
	}
	for i, r := range fallbackReasons {
		s.ResumeFallbacks[r] = c.fallbacks[i].Load()
	}
	for i, r := range resyncReasons {
		s.TailResyncs[r] = c.resyncs[i].Load()
	}
	var cum int64
	for i := range LagBuckets {
		cum += c.lagBuckets[i].Load()
		s.LagBuckets[i] = cum
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
