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

// Write stores s in Redis only if no snapshot of the task is stored or the
// stored version is lower, clears the task's negative-cache key, and, when it
// wrote and channel is not empty, publishes message on channel: one Lua script,
// one round trip, so a notification is never published for a snapshot that
// was not stored. ttl <= 0 means TTLWithJitter(s.Status). It reports whether
// it wrote.
//
// Store.SetIfNewer and the fanout publisher both write through it. The script
// names two keys and publishes from inside, which standalone Redis allows; on
// Redis Cluster both keys would have to share a hash slot, which the key
// names of package keys do not give them.
func Write(ctx context.Context, rdb redis.Scripter, names keys.Names, s *Snapshot, ttl time.Duration, channel string, message []byte) (written bool, err error) {
	if s == nil || len(s.raw) == 0 {
		return false, errors.New("snapshot write: empty snapshot")
	}
	if ttl <= 0 {
		ttl = TTLWithJitter(s.Status)
	}
	n, err := setIfNewerScript.Run(ctx, rdb,
		[]string{names.Snapshot(s.TaskID), names.NotFound(s.TaskID)},
		writeArgs(s, ttl, channel, message)...,
	).Int64()
	if err != nil {
		return false, fmt.Errorf("snapshot write %s: %w", s.TaskID, err)
	}
	return n == 1, nil
}

// writeArgs are the ARGV of setifnewer.lua.
func writeArgs(s *Snapshot, ttl time.Duration, channel string, message []byte) []any {
	ms := max(ttl.Milliseconds(), 1)
	return []any{s.raw, strconv.FormatInt(s.Version, 10), ms, channel, message}
}
