package hub

import (
	"context"
	"math"
	"sync/atomic"
	"time"

	"github.com/pushd/pushd/snapshot"
)

// ReadSource is why the hub read a task: what a delivery of it came from.
type ReadSource uint8

// Reasons the hub reads a task.
const (
	ReadNone      ReadSource = iota // no read recorded
	ReadHint                        // a notification over the bus
	ReadStream                      // an entry of the Stream (a gap in the bus closed)
	ReadRepair                      // a repair round
	ReadPoll                        // a polling round or a resync
	ReadSubscribe                   // a subscription's initial state (a resume's replay included)
)

// String names the source as the admin API shows it.
func (r ReadSource) String() string {
	switch r {
	case ReadHint:
		return "hint"
	case ReadStream:
		return "stream"
	case ReadRepair:
		return "repair"
	case ReadPoll:
		return "poll"
	case ReadSubscribe:
		return "subscribe"
	}
	return "none"
}

// taskNote is what the node last heard and read of one task watched by id:
// one per index entry, not per connection, for an operator's inspection.
// Four atomic words, 32 bytes (48 with a mutex), and nothing on the
// delivery path waits for another record or a reader. Each word is read
// atomically, not all at one instant: an inspection that races two
// records, made moments apart, may pair the version of one with the time
// of the other.
type taskNote struct {
	hintVersion atomic.Int64
	hintAt      atomic.Int64 // Unix ms
	readVersion atomic.Int64
	// readHow is the read's Unix ms shifted left 16 bits, its ReadSource
	// in the next 8 and its snapshot.Origin in the last: 48 bits of
	// milliseconds last until the year 10889.
	readHow atomic.Uint64
}

func (n *taskNote) hint(version, atNS int64) {
	n.hintVersion.Store(version)
	n.hintAt.Store(atNS / int64(time.Millisecond))
}

func (n *taskNote) read(s *snapshot.Snapshot, source ReadSource, at time.Time) {
	n.readVersion.Store(s.Version)
	n.readHow.Store(uint64(at.UnixMilli())<<16 | uint64(source)<<8 | uint64(s.Origin))
}

// load reads the note.
func (n *taskNote) load() (TaskHint, TaskRead) {
	h := TaskHint{Version: n.hintVersion.Load(), At: unixMilli(n.hintAt.Load())}
	how := n.readHow.Load()
	r := TaskRead{Version: n.readVersion.Load(), Source: ReadSource(how >> 8), Origin: snapshot.Origin(how), At: unixMilli(int64(how >> 16))}
	return h, r
}

// noteRead records that s was read for source, once per read however many
// connections it is offered to; a task no connection here watches by id
// has no note and costs a lookup.
func (h *Hub) noteRead(s *snapshot.Snapshot, source ReadSource) {
	if note := h.idx.noteOf(key{s.TenantID, s.TaskID}); note != nil {
		note.read(s, source, time.Now())
	}
}

// sentStamp is now as tracked.sent keeps it: whole seconds since the hub
// started, plus one so that 0 means none. Four bytes last 136 years.
func (h *Hub) sentStamp() uint32 {
	return uint32(min(time.Since(h.started)/time.Second+1, math.MaxUint32))
}

// sentTime is the time a sentStamp stands for, rounded down to its second;
// zero for none.
func (h *Hub) sentTime(stamp uint32) time.Time {
	if stamp == 0 {
		return time.Time{}
	}
	return h.started.Add(time.Duration(stamp-1) * time.Second)
}

// TaskReport is what a node knows of a task's delivery (Hub.InspectTask).
type TaskReport struct {
	// Snapshot is the task as the node's source reads it now.
	Snapshot *snapshot.Snapshot
	// Watchers are the connections here that watch the task, at most the
	// limit asked for; Truncated counts the index entries past it (a
	// connection watching the task two ways is two entries).
	Watchers  []WatcherReport
	Truncated int
	// Hint and Read are the last notification heard and the last read made
	// of the task; zero (Version 0) when none was, or when no connection
	// here watches it by id: only those keep a note.
	Hint TaskHint
	Read TaskRead
}

// WatcherReport is one connection watching an inspected task.
type WatcherReport struct {
	ConnID    string
	TenantID  string
	UserID    string
	Transport Transport
	// How the connection watches the task; more than one may hold.
	ByID, ByProject, ByUser bool
	// Allowed: the connection's grant lets it see the task now.
	Allowed bool
	// Sent is the last version taken for writing to the connection (0 for
	// none), SentAt when, rounded down to the second; zero when the version
	// was recorded without a write (a resumed client held it).
	Sent   int64
	SentAt time.Time
	// Pending is the version waiting in the connection's outbox, 0 for none.
	Pending int64
	// Writing: a write to the connection is in flight or waits in its
	// backlog (a client that reads slowly), so what was sent may not have
	// reached the socket yet.
	Writing bool
}

// TaskHint is a notification the node heard of a task.
type TaskHint struct {
	Version int64
	At      time.Time
}

// TaskRead is a read the node made of a task for delivery.
type TaskRead struct {
	Version int64
	Source  ReadSource
	Origin  snapshot.Origin
	At      time.Time
}

// InspectTask reports what this node knows of the delivery of task id: the
// task as the source reads it now, up to limit connections watching it here
// with what each was sent, and the last notification and read of it. It
// fails as the source's Get does: ErrInvalidID, ErrNotFound (also for a
// task no source has that connections watch), ErrUnavailable.
//
// It takes the locks delivery takes, each briefly: a shard's read lock per
// way of watching, to copy at most limit pointers, then each listed
// connection's mu in turn.
func (h *Hub) InspectTask(ctx context.Context, id string, limit int) (TaskReport, error) {
	s, err := h.cfg.Source.Get(ctx, id, 0)
	if err != nil {
		return TaskReport{}, err
	}
	r := TaskReport{Snapshot: s}
	var conns []*Conn
	for kind, k := range [kinds]key{
		byTask:    {s.TenantID, s.TaskID},
		byProject: {s.TenantID, s.ProjectID},
		byUser:    {s.TenantID, s.UserID},
	} {
		if k.id == "" {
			continue
		}
		before := len(conns)
		var total int
		conns, total = h.idx.collectUpTo(kind, k, conns, limit-len(conns))
		r.Truncated += total - (len(conns) - before)
	}
	seen := make(map[*Conn]struct{}, len(conns))
	for _, c := range conns {
		if _, ok := seen[c]; ok {
			continue // watching two ways: listed once, its entry counted once
		}
		seen[c] = struct{}{}
		if w, ok := c.inspect(s); ok {
			r.Watchers = append(r.Watchers, w)
		}
	}
	if note := h.idx.peekNote(key{s.TenantID, s.TaskID}); note != nil {
		r.Hint, r.Read = note.load()
	}
	return r, nil
}

// inspect reports what c watches and holds of s's task; false when c is
// closed or no longer watches it.
func (c *Conn) inspect(s *snapshot.Snapshot) (WatcherReport, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed || c.ending {
		return WatcherReport{}, false
	}
	w := WatcherReport{
		ConnID: c.ID, TenantID: c.TenantID, UserID: c.UserID, Transport: c.Transport,
		ByID:      c.tasks.has(s.TaskID),
		ByProject: s.ProjectID != "" && c.projects.has(s.ProjectID),
		ByUser:    c.userScope && s.UserID == c.UserID,
		Allowed:   c.Sees(s),
		Writing:   c.parked.on,
	}
	if !w.ByID && !w.ByProject && !w.ByUser {
		return WatcherReport{}, false
	}
	if t := c.track.get(s.TaskID); t != nil {
		w.Sent, w.SentAt = t.delivered, c.hub.sentTime(t.sent)
		if t.snap != nil {
			w.Pending = t.snap.Version
		}
	}
	return w, true
}

// unixMilli is the time of Unix ms, the zero time for 0 (none).
func unixMilli(ms int64) time.Time {
	if ms == 0 {
		return time.Time{}
	}
	return time.UnixMilli(ms)
}
