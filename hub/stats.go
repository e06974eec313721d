package hub

import (
	"sync/atomic"

	"github.com/pushd/pushd/internal/histogram"
)

// Drop is why a snapshot offered to a connection was not queued for it.
// Each reason is a counter (Stats.Dropped) and a metric label (String).
type Drop uint8

// Reasons a snapshot is dropped.
const (
	DropStale  Drop = iota // not newer than the version the connection has or holds pending
	DropTenant             // another tenant's: checked on every delivery, not only at subscribe
	DropGrant              // of the connection's tenant, but outside its grant
	NumDrops               // the number of Drops, for arrays indexed by them
)

// String is the drop's metric label.
func (d Drop) String() string {
	switch d {
	case DropStale:
		return "stale"
	case DropTenant:
		return "tenant"
	case DropGrant:
		return "grant"
	}
	return "unknown"
}

// Cut is why the hub ended a connection on its own (the client did not
// leave, and the node is not shutting down). Each reason is a counter
// (Stats.Cuts); String is its metric label, which a slow client's two
// reasons share.
type Cut uint8

// Reasons the hub ends a connection.
const (
	CutSlow         Cut = iota // what waited for it outgrew a bound: more tasks or control events pending than it may hold
	CutWriteFailed             // a write failed, or its backlog was not read within the write timeout
	CutTokenExpired            // its token's exp passed
	CutFlooded                 // it sent control frames (pings, pongs) past its budget
	NumCuts                    // the number of Cuts, for arrays indexed by them
)

// String is the cut's metric label.
func (c Cut) String() string {
	switch c {
	case CutSlow, CutWriteFailed:
		return "slow_client"
	case CutTokenExpired:
		return "token_expired"
	case CutFlooded:
		return "control_flood"
	}
	return "unknown"
}

// counters are what Stats reads: atomic adds on the delivery path, and
// the two histograms.
type counters struct {
	opened, closed, notifications, resyncs                       atomic.Int64
	fetches, fetchErrors, delivered, conflated, patches          atomic.Int64
	refreshes, batchedReads, backlogged, heartbeats              atomic.Int64
	dropped                                                      [NumDrops]atomic.Int64
	cuts                                                         [NumCuts]atomic.Int64
	dispatchNoWatch, modeSwitches, polls, pollErrors, busRetries atomic.Int64
	readRetries, readsLimited                                    atomic.Int64
	catchUps, resumes, resumeTasks, resumeFallbacks              atomic.Int64
	resumeMismatches                                             atomic.Int64
	repairOlder, repairUnheld                                    atomic.Int64
	pushed, reconnects                                           [NumTransports]atomic.Int64
	notifyToWrite, staleness, repairAge                          *histogram.Histogram
	notifyQueued, notifyRead                                     *histogram.Histogram
}

// Stats are the hub's counters since it started and its gauges now, for
// tests and metrics.
type Stats struct {
	Conns      int         // open connections (Len)
	ConnCounts []ConnCount // the same by transport and plan
	Mode       string      // ModePush or ModePolling
	// PollingTenants are the tenants polled because their shard of the
	// bus is lost (Redis Cluster), now.
	PollingTenants int

	Opened          int64
	Closed          int64
	Notifications   int64
	Resyncs         int64
	Fetches         int64 // snapshot reads for notifications
	BatchedReads    int64 // reads that served several notified tasks at once
	FetchErrors     int64
	Delivered       int64 // task events written
	Patches         int64 // of them, written as a merge patch (Principal.Deltas)
	Conflated       int64 // pending snapshots replaced by a newer one
	Refreshes       int64 // tokens connections were refreshed with
	Backlogged      int64 // writes a sink queued because the client's socket was full
	Heartbeats      int64
	DispatchNoWatch int64 // notifications no local connection watches
	ModeSwitches    int64 // push ↔ polling
	Polls           int64 // rounds of re-reading every watched task, or those of the tenants of lost shards
	PollErrors      int64 // rounds in which no source answered for some tasks
	BusRetries      int64 // bus subscriptions retried after failing
	ReadRetries     int64 // rounds re-reading, in batches, the tenants of connections whose initial read failed
	ReadsLimited    int64 // subscribed ids and scopes refused because their user's read budget was spent
	// HotTasks are the tasks watched by id by Config.HotTaskWatchers of
	// this node's connections or more, now; HotTasksDetected counts the
	// times a task reached that many, once per crossing.
	HotTasks         int
	HotTasksDetected int64

	// With a Stream.
	CatchUps        int64 // bus gaps (a tenant's Resync, a lost bus's poll round or its restoration) closed by the stream instead of re-reading
	Resumes         int64 // subscriptions served by replaying the stream after the client's cursor
	ResumeTasks     int64 // tasks those replays read and offered
	ResumeFallbacks int64 // resume cursors the stream could not serve: the subscription read everything
	// Of ResumeFallbacks, the cursors not even offered to the stream: they
	// were issued for another subscription (Subscription.ResumeMismatch).
	ResumeMismatches int64

	// Of the repair rounds' deliveries (OfferChecked; the rounds
	// themselves are counted by package converge). RepairOlder and
	// RepairUnheld count the tasks a repair round found in Redis and
	// delivered, at least a second after their updated_at, to a
	// connection here that held an older version (a hint lost or never
	// published), or that held none (a resume past a change its stream
	// lacks, a task created without a hint).
	RepairOlder  int64
	RepairUnheld int64
	// RepairAge is the time from a repaired change's updated_at to the
	// round that found it: the counted ones above, and those a round
	// found newer in the database (Checked.Repaired).
	RepairAge histogram.Snapshot

	Dropped [NumDrops]int64 // snapshots offered and not queued, by reason
	Cuts    [NumCuts]int64  // connections the hub ended on its own, by reason

	// By Transport.
	Pushed     [NumTransports]int64 // task events written
	Reconnects [NumTransports]int64 // connections that subscribed with a resume position (Subscription.Resume, ResumeMismatch or Since)

	// NotifyToWrite is the time from Notify to the write of the snapshot
	// the notification announced, per task event written. Staleness is the
	// time from a snapshot's updated_at to its write, per task event of a
	// change learned after the subscription (notification, poll, stream);
	// the initial state of a subscription is measured by neither.
	NotifyToWrite histogram.Snapshot
	Staleness     histogram.Snapshot
	// The first stages of NotifyToWrite: NotifyQueued is the time from
	// Notify to a dispatcher taking the task, per notified task read;
	// NotifyRead the read's own time, per read (a batch's once). What is
	// left, NotifyToWrite less both, is offering the snapshot and a
	// writer's turn and write.
	NotifyQueued histogram.Snapshot
	NotifyRead   histogram.Snapshot
}

// Stats reads the hub's counters and gauges. Each is read atomically, not
// all of them at one instant.
func (h *Hub) Stats() Stats {
	c := &h.stats
	s := Stats{
		Conns: h.Len(), ConnCounts: h.ConnCounts(),
		Opened: c.opened.Load(), Closed: c.closed.Load(),
		Notifications: c.notifications.Load(), Resyncs: c.resyncs.Load(),
		Fetches: c.fetches.Load(), BatchedReads: c.batchedReads.Load(), FetchErrors: c.fetchErrors.Load(),
		Delivered: c.delivered.Load(), Patches: c.patches.Load(), Conflated: c.conflated.Load(),
		Refreshes: c.refreshes.Load(), Backlogged: c.backlogged.Load(), Heartbeats: c.heartbeats.Load(),
		DispatchNoWatch: c.dispatchNoWatch.Load(), ModeSwitches: c.modeSwitches.Load(),
		Polls: c.polls.Load(), PollErrors: c.pollErrors.Load(), BusRetries: c.busRetries.Load(),
		ReadRetries: c.readRetries.Load(), ReadsLimited: c.readsLimited.Load(),
		HotTasks: h.idx.hotTasks(), HotTasksDetected: h.idx.hotCrossings.Load(),
		CatchUps: c.catchUps.Load(),
		Resumes:  c.resumes.Load(), ResumeTasks: c.resumeTasks.Load(), ResumeFallbacks: c.resumeFallbacks.Load(), ResumeMismatches: c.resumeMismatches.Load(),
		NotifyToWrite: c.notifyToWrite.Snapshot(),
		NotifyQueued:  c.notifyQueued.Snapshot(),
		NotifyRead:    c.notifyRead.Snapshot(),
		Staleness:     c.staleness.Snapshot(),
		RepairOlder:   c.repairOlder.Load(), RepairUnheld: c.repairUnheld.Load(),
		RepairAge: c.repairAge.Snapshot(),
	}
	s.Mode, _ = h.Mode()
	s.PollingTenants = h.PollingTenants()
	for t := range NumTransports {
		s.Pushed[t] = c.pushed[t].Load()
		s.Reconnects[t] = c.reconnects[t].Load()
	}
	for d := range NumDrops {
		s.Dropped[d] = c.dropped[d].Load()
	}
	for r := range NumCuts {
		s.Cuts[r] = c.cuts[r].Load()
	}
	return s
}

// drop counts a snapshot dropped for d.
func (h *Hub) drop(d Drop) { h.stats.dropped[d].Add(1) }

// cut counts a connection ended for r.
func (h *Hub) cut(r Cut) { h.stats.cuts[r].Add(1) }
