package rediswrite

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pushd/pushd/keys"
	"github.com/pushd/pushd/snapshot"
)

// The two write scripts append to a stream the same way: each is
// streamappend.lua's append function followed by its own body, so the
// entry's fields and the epoch rule have one source. Likewise announce.lua
// and forgetentry.lua remove a journal entry with forget.lua's one rule.
var (
	//go:embed streamappend.lua
	streamAppendLua string
	//go:embed setifnewer.lua
	setIfNewerLua string
	//go:embed announce.lua
	announceLua string
	//go:embed forget.lua
	forgetLua string
	//go:embed forgetentry.lua
	forgetEntryLua string
	//go:embed journal.lua
	journalLua string

	setIfNewerScript = redis.NewScript(streamAppendLua + setIfNewerLua)
	announceScript   = redis.NewScript(streamAppendLua + forgetLua + announceLua)
	forgetScript     = redis.NewScript(forgetLua + forgetEntryLua)
	journalScript    = redis.NewScript(journalLua)
)

// EventChanged is the event_type of the stream entries Write appends. A
// writer that only holds the snapshot knows that the task changed, not why;
// pushd reads task_id and version and ignores the type, so a Task State
// Service appending to the stream itself may use finer types.
const EventChanged = "task.changed"

// Write stores s in Redis only if no snapshot of the task is stored or the
// stored version is lower, clears the task's negative-cache key, and, when it
// wrote and channel is not empty, publishes message on channel: one Lua script,
// one round trip, so a notification is never published for a snapshot that
// was not stored. ttl <= 0 means snapshot.TTLWithJitter(s.Status). It
// reports whether it wrote. A stored snapshot of another tenant, or a stored
// document whose version cannot be read, refuses the write with
// snapshot.ErrTenantMismatch or snapshot.ErrStoredUnreadable (see Outcome).
//
// Beside the document the script keeps keys.Names.SnapshotMeta: the
// version, the tenant and a digest of the document, so writes compare
// without decoding it and readers GET the document key as before.
//
// store.Store.SetIfNewer and the fanout publisher both write through it.
// The script names keys that share a slot on Redis Cluster only with
// keys.Names.Cluster's names; there the announcement, in the tenant's slot,
// cannot come from the same script: see WriteIfNewer.
func Write(ctx context.Context, rdb redis.Scripter, names keys.Names, s *snapshot.Snapshot, ttl time.Duration, channel string, message []byte) (written bool, err error) {
	return WriteStream(ctx, rdb, names, s, ttl, channel, message, 0)
}

// WriteStream is Write that, when streamMaxLen > 0 and it wrote, also
// appends the change to the tenant's stream (keys.Names.Stream) with XADD
// MAXLEN ~ streamMaxLen, in the same script: a stale version appends
// nothing, and the entry, the snapshot and the notification are one atomic
// step. The entry's fields are task_id, version, event_type (EventChanged),
// project_id, user_id and occurred_at (the snapshot's updated_at, Unix ms).
// When the script creates the stream, it records the new entry's id as the
// stream's epoch (keys.Names.StreamEpoch).
func WriteStream(ctx context.Context, rdb redis.Scripter, names keys.Names, s *snapshot.Snapshot, ttl time.Duration, channel string, message []byte, streamMaxLen int64) (written bool, err error) {
	if s == nil || len(s.JSON()) == 0 {
		return false, errors.New("snapshot write: empty snapshot")
	}
	if ttl <= 0 {
		ttl = snapshot.TTLWithJitter(s.Status)
	}
	ks := writeKeys(names, s.TaskID)
	args := writeArgs(s, ttl, channel, message)
	if streamMaxLen > 0 {
		ks = append(ks, names.Stream(s.TenantID), names.StreamEpoch(s.TenantID))
		args = append(args, streamMaxLen, s.TaskID, EventChanged, s.ProjectID, s.UserID, s.UpdatedAt)
	}
	n, err := setIfNewerScript.Run(ctx, rdb, ks, args...).Int64()
	if err != nil {
		return false, fmt.Errorf("snapshot write %s: %w", s.TaskID, err)
	}
	out := Outcome(n)
	return out == Written, out.Err(s.TaskID)
}

// Outcome is what a conditional write did.
type Outcome int

// The values are the write script's replies.
const (
	Stale   Outcome = 0 // a newer version is stored: nothing written
	Written Outcome = 1
	Current Outcome = 2 // this very version is stored already: nothing written
	// TenantMismatch: the stored snapshot is another tenant's; nothing
	// written (ErrTenantMismatch).
	TenantMismatch Outcome = 3
	// Unreadable: the stored document's version or tenant cannot be read;
	// nothing written until it expires (ErrStoredUnreadable).
	Unreadable Outcome = 4
)

// Err is the error of a refused write, nil for the other outcomes.
func (o Outcome) Err(taskID string) error {
	switch o {
	case Stale, Written, Current:
		return nil
	case TenantMismatch:
		return fmt.Errorf("snapshot write %s: %w", taskID, snapshot.ErrTenantMismatch)
	case Unreadable:
		return fmt.Errorf("snapshot write %s: %w", taskID, snapshot.ErrStoredUnreadable)
	}
	return fmt.Errorf("snapshot write %s: unknown script reply %d", taskID, int(o))
}

// WriteIfNewer is Write without an announcement, telling a stale version
// from one stored already. On Redis Cluster the snapshot lives in the task's
// slot and the tenant's channel in another (on split Redis, on another
// server), so a publisher journals the publish first (Journal), then writes,
// then announces in a third call (Announce); when that call fails, the
// caller's retry finds its version Current and announces again, and when
// the caller never retries (it crashed) the nodes' reconcile finds the
// journal entry and announces the stored version. A refused write returns
// TenantMismatch or Unreadable with its error.
func WriteIfNewer(ctx context.Context, rdb redis.Scripter, names keys.Names, s *snapshot.Snapshot, ttl time.Duration) (Outcome, error) {
	if s == nil || len(s.JSON()) == 0 {
		return Stale, errors.New("snapshot write: empty snapshot")
	}
	if ttl <= 0 {
		ttl = snapshot.TTLWithJitter(s.Status)
	}
	n, err := setIfNewerScript.Run(ctx, rdb, writeKeys(names, s.TaskID), writeArgs(s, ttl, "", nil)...).Int64()
	if err != nil {
		return Stale, fmt.Errorf("snapshot write %s: %w", s.TaskID, err)
	}
	out := Outcome(n)
	return out, out.Err(s.TaskID)
}

// SetIfNewer is the conditional write Write runs without an announcement,
// for a caller that pipelines many of them (the store's write-back): run it
// with WriteCall's keys and args and read its reply as an Outcome.
var SetIfNewer = setIfNewerScript

// WriteCall is the KEYS and ARGV of SetIfNewer storing s for ttl without an
// announcement.
func WriteCall(names keys.Names, s *snapshot.Snapshot, ttl time.Duration) (keys []string, args []any) {
	return writeKeys(names, s.TaskID), writeArgs(s, ttl, "", nil)
}

// writeKeys are the first KEYS of setifnewer.lua, all in the task's slot.
func writeKeys(names keys.Names, taskID string) []string {
	return []string{names.Snapshot(taskID), names.NotFound(taskID), names.SnapshotMeta(taskID)}
}

// writeArgs are the first ARGV of setifnewer.lua.
func writeArgs(s *snapshot.Snapshot, ttl time.Duration, channel string, message []byte) []any {
	ms := max(ttl.Milliseconds(), 1)
	return []any{s.JSON(), strconv.FormatInt(s.Version, 10), ms, channel, message, s.TenantID}
}
