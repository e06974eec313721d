package hub

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/pushd/pushd/snapshot"
)

// Stream is a replayable log of a tenant's changes that the hub can lean on
// (package stream, on Redis Streams): it closes the gaps of the at-most-once
// bus, gives connections a resume position any node understands, and
// replays what changed after one. Its methods must not call into the hub.
type Stream interface {
	// Covers reports whether every change of tenant reaches the hub through
	// the log right now (Hub.Apply), so a gap in the bus needs no re-read.
	Covers(tenant string) bool
	// CoversAll is Covers for every tenant the node watches.
	CoversAll() bool
	// Position is the tenant's resume cursor: every change at or before it
	// was offered to the connections that watched it at the time. "" when
	// the log has none. It must not allocate: the writers call it.
	Position(tenant string) string
	// Replay returns the tenant's changes after cursor, oldest first, and
	// those at or before it appended within window before it, newest first
	// (it may leave some of those out), or a reason why it cannot (the
	// cursor is corrupt, of another tenant or epoch, trimmed away, too far
	// behind, or the log is unavailable); the caller then reads everything,
	// as for a new client.
	Replay(ctx context.Context, tenant, cursor string, window time.Duration) (after, before []snapshot.Notification, fallback string)
}

// Apply delivers a batch of a tenant's changes read from the Stream before it
// returns: the tasks a local connection may watch are read (one read per
// task, served by the in-process cache when the bus already brought that
// version) and offered to their watchers. An error means some reads failed
// and nothing may be assumed delivered; the caller retries the batch. Only
// once Apply returned nil may the Stream move the tenant's Position past the
// batch.
//
// The Stream calls Apply from its readers, off the bus's path; notifications
// of the bus keep flowing to Notify meanwhile, and the versions rule of the
// outboxes drops whichever of the two copies comes second.
func (h *Hub) Apply(ctx context.Context, tenant string, changes []snapshot.Notification) error {
	if len(changes) == 0 {
		return nil
	}
	ids := make([]string, 0, len(changes))
	seen := make(map[string]struct{}, len(changes))
	for _, n := range changes {
		h.cfg.Source.Observe(n.TaskID, n.Version)
		if _, ok := seen[n.TaskID]; ok || !h.watched(key{tenant, n.TaskID}, n.ProjectID, n.UserID) {
			continue
		}
		seen[n.TaskID] = struct{}{}
		ids = append(ids, n.TaskID)
	}
	return h.readAndOffer(ctx, tenant, ids, nil)
}

// readAndOffer reads the tasks in batches and offers what it read: to c only
// when c is set, else to every watcher.
func (h *Hub) readAndOffer(ctx context.Context, tenant string, ids []string, c *Conn) error {
	var errs error
	var targets []*Conn
	for i := 0; i < len(ids); i += snapshot.MaxMany {
		batch := ids[i:min(i+snapshot.MaxMany, len(ids))]
		snaps, err := h.cfg.Source.GetMany(ctx, batch)
		if err != nil {
			errs = errors.Join(errs, err)
			continue
		}
		for _, s := range snaps {
			switch {
			case s.TenantID != tenant:
				h.drop(DropTenant)
			case c != nil: // a resuming connection's initial state
				h.noteRead(s, ReadSubscribe)
				c.offer(s, news{})
			default:
				h.noteRead(s, ReadStream)
				targets = h.offerToWatchers(s, news{live: true}, targets[:0])
			}
		}
	}
	if errs != nil {
		return fmt.Errorf("read %d tasks of %s: %w", len(ids), tenant, errs)
	}
	return nil
}

// ResyncNow re-reads every task the tenant's connections watch, bypassing
// caches, before it returns, and reports whether every read succeeded. The
// Stream calls it when its log cannot close a gap (trimmed past its
// position, or Redis lost the stream), before it hands out positions of the
// new log.
func (h *Hub) ResyncNow(tenant string) bool {
	h.stats.resyncs.Add(1)
	return h.refresh(map[string]struct{}{tenant: {}}, false)
}

// replay offers c the tasks that changed after its resume cursor (after),
// among those this Subscribe added (tasks, projects, user), instead of
// everything they hold: the client has the rest. It first records the
// versions the client holds of the tasks changed shortly before the cursor
// (before), which repair rounds would otherwise take for news.
func (c *Conn) replay(ctx context.Context, after, before []snapshot.Notification, tasks, projects []string, user bool) error {
	// By id, the subscription's own string: a record of the task then
	// shares it rather than keeping the entry's.
	want := make(map[string]string, len(tasks))
	for _, id := range tasks {
		want[id] = id
	}
	inProject := make(map[string]struct{}, len(projects))
	for _, id := range projects {
		inProject[id] = struct{}{}
	}
	// covered says whether the subscription covers n's task: an entry that
	// does not name its project or user may still be in scope (the
	// snapshot says, and offer checks) unless certain is asked for.
	covered := func(n snapshot.Notification, certain bool) bool {
		if _, ok := want[n.TaskID]; ok {
			return true
		}
		_, byProject := inProject[n.ProjectID]
		byUser := user && n.UserID == c.UserID
		if certain {
			return byProject || byUser
		}
		return (len(projects) > 0 && (byProject || n.ProjectID == "")) || (user && (byUser || n.UserID == ""))
	}
	c.mu.Lock()
	for _, n := range before {
		// Offered to the client's previous connection before its cursor
		// was written: the client holds that version or a newer one.
		if id, ok := want[n.TaskID]; ok {
			c.holdsLocked(id, n.Version)
		} else if covered(n, true) {
			c.holdsLocked(n.TaskID, n.Version)
		}
	}
	c.mu.Unlock()
	h := c.hub
	var ids []string
	seen := make(map[string]struct{})
	for _, n := range after {
		h.cfg.Source.Observe(n.TaskID, n.Version)
		if _, ok := seen[n.TaskID]; ok {
			continue
		}
		if covered(n, false) {
			seen[n.TaskID] = struct{}{}
			ids = append(ids, n.TaskID)
		}
	}
	h.stats.resumeTasks.Add(int64(len(ids)))
	return h.readAndOffer(ctx, c.TenantID, ids, c)
}
