// Package rediswrite is the former path of the Lua write protocol, which
// is snapshot/rediswrite now: it hands the same names on, so a Task State
// Service that imports it keeps building.
//
// Deprecated: import github.com/pushd/pushd/snapshot/rediswrite.
package rediswrite

import (
	"context"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pushd/pushd/keys"
	"github.com/pushd/pushd/snapshot"
	w "github.com/pushd/pushd/snapshot/rediswrite"
)

// The protocol's constants and types, as snapshot/rediswrite has them.
const (
	JournalTTL     = w.JournalTTL
	EventChanged   = w.EventChanged
	Stale          = w.Stale
	Written        = w.Written
	Current        = w.Current
	TenantMismatch = w.TenantMismatch
	Unreadable     = w.Unreadable
)

type (
	Pending      = w.Pending
	Announcement = w.Announcement
	Outcome      = w.Outcome
)

// SetIfNewer is snapshot/rediswrite's SetIfNewer.
var SetIfNewer = w.SetIfNewer

// ParsePending is snapshot/rediswrite's ParsePending.
func ParsePending(member string, score float64) (Pending, bool) { return w.ParsePending(member, score) }

// Journal is snapshot/rediswrite's Journal.
func Journal(ctx context.Context, rdb redis.Scripter, names keys.Names, s *snapshot.Snapshot) (Pending, error) {
	return w.Journal(ctx, rdb, names, s)
}

// Forget is snapshot/rediswrite's Forget.
func Forget(ctx context.Context, rdb redis.Scripter, names keys.Names, tenant string, p Pending) (bool, error) {
	return w.Forget(ctx, rdb, names, tenant, p)
}

// Announce is snapshot/rediswrite's Announce.
func Announce(ctx context.Context, rdb redis.Scripter, names keys.Names, a Announcement) (bool, error) {
	return w.Announce(ctx, rdb, names, a)
}

// Write is snapshot/rediswrite's Write.
func Write(ctx context.Context, rdb redis.Scripter, names keys.Names, s *snapshot.Snapshot, ttl time.Duration, channel string, message []byte) (bool, error) {
	return w.Write(ctx, rdb, names, s, ttl, channel, message)
}

// WriteStream is snapshot/rediswrite's WriteStream.
func WriteStream(ctx context.Context, rdb redis.Scripter, names keys.Names, s *snapshot.Snapshot, ttl time.Duration, channel string, message []byte, streamMaxLen int64) (bool, error) {
	return w.WriteStream(ctx, rdb, names, s, ttl, channel, message, streamMaxLen)
}

// WriteIfNewer is snapshot/rediswrite's WriteIfNewer.
func WriteIfNewer(ctx context.Context, rdb redis.Scripter, names keys.Names, s *snapshot.Snapshot, ttl time.Duration) (Outcome, error) {
	return w.WriteIfNewer(ctx, rdb, names, s, ttl)
}

// WriteCall is snapshot/rediswrite's WriteCall.
func WriteCall(names keys.Names, s *snapshot.Snapshot, ttl time.Duration) ([]string, []any) {
	return w.WriteCall(names, s, ttl)
}
