package hub

import (
	"time"

	"github.com/pushd/pushd/snapshot"
)

// CountRepair offers s to its watchers as a repair round that found it in
// Redis does, counting it as a repair if a connection lacked it.
func CountRepair(h *Hub, s *snapshot.Snapshot) { h.countRepair(s, time.Now(), nil) }

// PendingVersion is the version of task waiting in c's outbox, 0 if none.
func PendingVersion(c *Conn, task string) int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	if t := c.track.get(task); t != nil && t.snap != nil {
		return t.snap.Version
	}
	return 0
}

// Remembered is how many task versions c keeps as delivered.
func Remembered(c *Conn) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	c.track.each(func(t *tracked) {
		if t.delivered > 0 {
			n++
		}
	})
	return n
}

// DeliveredVersion is the version of task c remembers as delivered, 0 if
// none.
func DeliveredVersion(c *Conn, task string) int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	if t := c.track.get(task); t != nil {
		return t.delivered
	}
	return 0
}

// HoldConn takes c's lock, as a Subscribe admitting it does, until the
// returned function.
func HoldConn(c *Conn) (release func()) {
	c.mu.Lock()
	return c.mu.Unlock
}

// Refresh re-reads every watched task, as after the bus came back.
func Refresh(h *Hub) bool { return h.refresh(nil, false) }

// rewatchUsers is how many users have a rewatch record.
func (b *readBudgets) rewatchUsers() int {
	n := 0
	for i := range b.shards {
		sh := &b.shards[i]
		sh.mu.Lock()
		n += len(sh.rewatch)
		sh.mu.Unlock()
	}
	return n
}

// Tick runs one pass of the ticker at now: heartbeats due, tokens expired,
// sessions revoked.
func Tick(h *Hub, now time.Time) { h.tick(now) }
