package snapshot

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pushd/pushd/keys"
)

//go:embed setifnewer.lua
var setIfNewerLua string

var setIfNewerScript = redis.NewScript(setIfNewerLua)

// EventChanged is the event_type of the stream entries Write appends. A
// writer that only holds the snapshot knows that the task changed, not why;
// pushd reads task_id and version and ignores the type, so a Task State
// Service appending to the stream itself may use finer types.
const EventChanged = "task.changed"

// Write stores s in Redis only if no snapshot of the task is stored or the
// stored version is lower, clears the task's negative-cache key, and, when it
// wrote and channel is not empty, publishes message on channel: one Lua script,
// one round trip, so a notification is never published for a snapshot that
// was not stored. ttl <= 0 means TTLWithJitter(s.Status). It reports whether
// it wrote.
//
// Store.SetIfNewer and the fanout publisher both write through it. The script
// names two keys, which share a slot on Redis Cluster only with
// keys.Names.Cluster's names; there the announcement, in the tenant's slot,
// cannot come from the same script: see WriteIfNewer.
func Write(ctx context.Context, rdb redis.Scripter, names keys.Names, s *Snapshot, ttl time.Duration, channel string, message []byte) (written bool, err error) {
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
func WriteStream(ctx context.Context, rdb redis.Scripter, names keys.Names, s *Snapshot, ttl time.Duration, channel string, message []byte, streamMaxLen int64) (written bool, err error) {
	if s == nil || len(s.raw) == 0 {
		return false, errors.New("snapshot write: empty snapshot")
	}
	if ttl <= 0 {
		ttl = TTLWithJitter(s.Status)
	}
	ks := []string{names.Snapshot(s.TaskID), names.NotFound(s.TaskID)}
	args := writeArgs(s, ttl, channel, message)
	if streamMaxLen > 0 {
		ks = append(ks, names.Stream(s.TenantID), names.StreamEpoch(s.TenantID))
		args = append(args, streamMaxLen, s.TaskID, EventChanged, s.ProjectID, s.UserID, s.UpdatedAt)
	}
	n, err := setIfNewerScript.Run(ctx, rdb, ks, args...).Int64()
	if err != nil {
		return false, fmt.Errorf("snapshot write %s: %w", s.TaskID, err)
	}
	return Outcome(n) == Written, nil
}

// Outcome is what a conditional write did.
type Outcome int

// The values are the write script's replies.
const (
	Stale   Outcome = 0 // a newer version is stored: nothing written
	Written Outcome = 1
	Current Outcome = 2 // this very version is stored already: nothing written
)

// WriteIfNewer is Write without an announcement, telling a stale version
// from one stored already. On Redis Cluster the snapshot lives in the task's
// slot and the tenant's channel in another, so a publisher announces in a
// second call; when that call fails, the caller's retry finds its version
// Current and announces again, so watchers never miss a stored change.
func WriteIfNewer(ctx context.Context, rdb redis.Scripter, names keys.Names, s *Snapshot, ttl time.Duration) (Outcome, error) {
	if s == nil || len(s.raw) == 0 {
		return Stale, errors.New("snapshot write: empty snapshot")
	}
	if ttl <= 0 {
		ttl = TTLWithJitter(s.Status)
	}
	ks := []string{names.Snapshot(s.TaskID), names.NotFound(s.TaskID)}
	n, err := setIfNewerScript.Run(ctx, rdb, ks, writeArgs(s, ttl, "", nil)...).Int64()
	if err != nil {
		return Stale, fmt.Errorf("snapshot write %s: %w", s.TaskID, err)
	}
	return Outcome(n), nil
}

// writeArgs are the first ARGV of setifnewer.lua.
func writeArgs(s *Snapshot, ttl time.Duration, channel string, message []byte) []any {
	ms := max(ttl.Milliseconds(), 1)
	return []any{s.raw, strconv.FormatInt(s.Version, 10), ms, channel, message}
}
