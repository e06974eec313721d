// Package keys names every Redis key and channel pushd reads or writes, so
// the Task State Service, the publisher and the nodes agree on one spelling.
//
// It is part of the public API for Task State Services, with fanout and
// snapshot: a service that writes or reads Redis itself takes its names here.
package keys

import (
	"net/url"
	"strings"
)

// Names builds key and channel names. The zero value uses the names of
// docs/DESIGN.md, "Key names", with no prefix.
type Names struct {
	// Prefix is prepended to every key, channel and stream. Empty means none.
	// It lets several environments (or test packages) share one Redis.
	Prefix string
	// Cluster spells the task keys for Redis Cluster: the task id in braces,
	// a hash tag, so a task's snapshot and negative-cache marker share the
	// slot the scripts that touch both need (task:snapshot:{<task_id>}).
	// Standalone Redis keeps the names without braces, which Task State
	// Services already write (docs/DESIGN.md, "Key names").
	Cluster bool
}

// Snapshot is the key of a task's JSON snapshot.
func (n Names) Snapshot(taskID string) string { return n.task("task:snapshot:", taskID) }

// SnapshotMeta is the key beside a task's snapshot that the write script
// keeps for it: the stored version, the tenant and a digest of the stored
// document, so a write compares versions and tenants without decoding the
// document, and notices a document written by hand since. It shares the
// snapshot key's hash tag on Redis Cluster.
func (n Names) SnapshotMeta(taskID string) string { return n.task("task:snapshot-meta:", taskID) }

// NotFound is the key of a task's negative-cache marker.
func (n Names) NotFound(taskID string) string { return n.task("task:notfound:", taskID) }

// Checked is the key of a task's repair marker, written by the nodes only:
// when a node last checked the task against PostgreSQL, the version it
// found there and whether that version was finished, so that one node of a
// fleet checks each watched task per repair interval, and a version
// checked once is not repaired again after Redis expired its snapshot.
func (n Names) Checked(taskID string) string { return n.task("task:checked:", taskID) }

// ScopeChecked is the key of a scope's repair marker, written by the nodes
// only: when a node last listed what changed in the project (kind
// "project") or user (kind "user") of a tenant, and from when the next
// listing starts, so that one node of a fleet lists each watched scope per
// repair interval. The braces are the tenant's hash tag, as its channel's.
func (n Names) ScopeChecked(tenantID, kind, id string) string {
	return n.Prefix + "scope:checked:{" + Join(tenantID) + "}:" + kind + ":" + Join(id)
}

func (n Names) task(kind, taskID string) string {
	if n.Cluster {
		return n.Prefix + kind + "{" + taskID + "}"
	}
	return n.Prefix + kind + taskID
}

// Channel is the Pub/Sub channel of a tenant's change notifications. The
// braces are a Redis Cluster hash tag: a tenant's channel and stream share a
// slot.
func (n Names) Channel(tenantID string) string {
	return n.Prefix + "task.changed.{" + tenantID + "}"
}

// Stream is the Redis Stream of a tenant's replayable events.
func (n Names) Stream(tenantID string) string {
	return n.Prefix + "stream:task-events:{" + tenantID + "}"
}

// StreamEpoch is the key naming the current incarnation of a tenant's
// stream: the id of the first entry appended to it since it was (re)created.
// The write script sets it whenever it creates the stream, so a stream that
// Redis lost and that was created again has a new epoch, and a resume cursor
// or a node's tail position from before the loss is recognised as stale even
// though the new stream's ids, taken from the clock, are larger. It shares the
// stream's hash tag.
func (n Names) StreamEpoch(tenantID string) string {
	return n.Prefix + "stream:task-epoch:{" + tenantID + "}"
}

// Unannounced is a tenant's unannounced journal: a sorted set of the
// publishes on Redis Cluster (or with the cache and realtime roles on two
// Redis servers) that may have stored their snapshot and not announced it
// yet, which nodes reconcile (snapshot/rediswrite, Journal). It shares the
// tenant's channel's hash tag, so the announcement removes the entry in the
// same script.
func (n Names) Unannounced(tenantID string) string {
	return n.Prefix + "task.unannounced.{" + tenantID + "}"
}

// ChangeReader is the key of the change reader's lease, written by the
// nodes only: a hash of the holder's token and node name that expires
// unless its holder renews it, so one node of a fleet listens to
// PostgreSQL's changes at a time. ChangeReaders is the readers' state
// beside it: the last token given, and the point (PostgreSQL's clock, in
// Unix microseconds) up to which a reader heard every change. The braces
// are one hash tag for both.
func (n Names) ChangeReader() string { return n.Prefix + "pushd:{changes}:reader" }

// ChangeReaders: see ChangeReader.
func (n Names) ChangeReaders() string { return n.Prefix + "pushd:{changes}:state" }

// Liveness is the Pub/Sub channel on which a bus on standalone Redis
// publishes to itself, to check that its subscription still delivers. id is
// the bus's own, random per bus.
func (n Names) Liveness(id string) string { return n.Prefix + "pushd.liveness.{" + id + "}" }

// ShardLiveness is the shard channel of the liveness check of a Redis
// Cluster shard whose first slot (the first of its first range) is slot: its
// hash tag is the shortest of letters and digits in that slot, so the
// channel lives on the shard, and every node names the same shard's channel
// alike. slot is in [0, 16384).
func (n Names) ShardLiveness(slot int) string {
	return n.Prefix + "pushd.liveness.{" + slotTag(slot) + "}"
}

// TenantFromChannel returns the tenant a channel name belongs to, and false
// when the name is not a change channel of this prefix.
func (n Names) TenantFromChannel(channel string) (string, bool) {
	rest, ok := strings.CutPrefix(channel, n.Prefix+"task.changed.{")
	if !ok {
		return "", false
	}
	tenant, ok := strings.CutSuffix(rest, "}")
	if !ok || tenant == "" {
		return "", false
	}
	return tenant, true
}

// Join spells ids as one part of a key name: each id query-escaped, then
// joined by ':'. Every key that names two or more ids (a user within its
// tenant, say) is spelled with it, and so is an id inside a hash tag. Ids
// may hold ':' themselves (tenant "t:a" with user "b", tenant "t" with user
// "a:b"), and callers pass ids from tokens: a plain join would give two
// principals one key. An escaped id holds no ':', '{' or '}', so different
// ids never share a spelling, and a hash tag is exactly its id. Ids of
// letters, digits and "-_.~" are spelled as they are.
func Join(ids ...string) string {
	esc := make([]string, len(ids))
	for i, id := range ids {
		esc[i] = url.QueryEscape(id)
	}
	return strings.Join(esc, ":")
}

// Split is Join's inverse: the ids a part joined by Join names.
func Split(joined string) ([]string, error) {
	ids := strings.Split(joined, ":")
	for i, e := range ids {
		id, err := url.QueryUnescape(e)
		if err != nil {
			return nil, err
		}
		ids[i] = id
	}
	return ids, nil
}
