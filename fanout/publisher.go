package fanout

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync/atomic"

	"github.com/redis/go-redis/v9"

	"github.com/pushd/pushd/fanout/rediswrite"
	"github.com/pushd/pushd/keys"
	"github.com/pushd/pushd/snapshot"
)

var errNilSnapshot = errors.New("publish: nil snapshot")

// RedisClient is what a RedisPublisher writes through: a *redis.Client or,
// with keys.Names.Cluster, a *redis.ClusterClient.
type RedisClient interface {
	redis.Scripter
	SPublish(ctx context.Context, channel string, message any) *redis.IntCmd
}

// RedisPublisher is the Publisher of a Task State Service, and of POST
// /v1/publish, on Redis: one Lua script stores the snapshot if it is newer,
// clears the task's negative cache and, only when it stored it, PUBLISHes
// the notification on the tenant's channel. A stale snapshot is neither
// written nor announced, and no notification ever announces a snapshot that
// was not stored. With WithStream, the same script also appends the change
// to the tenant's stream. It is safe for concurrent use.
//
// With keys.Names.Cluster (Redis Cluster) the snapshot, in the task's slot,
// and the tenant's channel, in the tenant's, cannot be one script: the
// publisher writes the snapshot, then SPUBLISHes on the tenant's shard
// channel. It announces only a version that is stored, and announces a
// version stored by an earlier call again, so a caller that retries after a
// failed announcement reaches the watchers. With WithStream the second step
// is one script in the tenant's slot (rediswrite.Announce) that appends to the
// tenant's stream, whose hash tag is the channel's, and SPUBLISHes; a retry
// appends no second entry for a version whose first one is still among the
// stream's newest.
//
// A snapshot of a task that Redis holds as another tenant's is refused
// with snapshot.ErrTenantMismatch, one whose stored document cannot be read
// with snapshot.ErrStoredUnreadable: neither is stored nor announced, and
// Stats counts both.
type RedisPublisher struct {
	client       RedisClient
	names        keys.Names
	streamMaxLen int64 // > 0: append to the tenant's stream, trimmed to about this many entries

	tenantMismatches, unreadableStored atomic.Uint64
}

// PublisherStats are monotonic counters of a RedisPublisher's refusals.
type PublisherStats struct {
	TenantMismatches uint64 // snapshots refused: Redis holds the task as another tenant's
	UnreadableStored uint64 // snapshots refused: the stored document's version or tenant could not be read
}

// Stats returns the counters so far.
func (p *RedisPublisher) Stats() PublisherStats {
	return PublisherStats{TenantMismatches: p.tenantMismatches.Load(), UnreadableStored: p.unreadableStored.Load()}
}

// refused counts a write the script refused, and returns err.
func (p *RedisPublisher) refused(err error) error {
	switch {
	case errors.Is(err, snapshot.ErrTenantMismatch):
		p.tenantMismatches.Add(1)
	case errors.Is(err, snapshot.ErrStoredUnreadable):
		p.unreadableStored.Add(1)
	}
	return fmt.Errorf("publish: %w", err)
}

// PublisherOption configures a RedisPublisher.
type PublisherOption func(*RedisPublisher)

// WithStream makes the publisher append every change it stores to the
// tenant's Redis Stream (keys.Names.Stream), trimmed with MAXLEN ~ maxLen,
// in the round trip that stores and announces it; maxLen <= 0 appends
// nothing. Nodes started with streams tail these streams and resume clients
// from them.
func WithStream(maxLen int64) PublisherOption {
	return func(p *RedisPublisher) { p.streamMaxLen = max(maxLen, 0) }
}

var _ Publisher = (*RedisPublisher)(nil)

// NewRedisPublisher returns a publisher writing through client with the
// given key and channel names, which must be the nodes' names.
func NewRedisPublisher(client RedisClient, names keys.Names, opts ...PublisherOption) *RedisPublisher {
	p := &RedisPublisher{client: client, names: names}
	for _, o := range opts {
		o(p)
	}
	return p
}

// Publish stores s if newer and announces it; written is false for a stale
// snapshot. The snapshot's TTL is the one of its status, with jitter.
func (p *RedisPublisher) Publish(ctx context.Context, s *snapshot.Snapshot) (written bool, err error) {
	if s == nil {
		return false, errNilSnapshot
	}
	msg, err := json.Marshal(snapshot.NotificationFor(s))
	if err != nil {
		return false, fmt.Errorf("publish %s: %w", s.TaskID, err)
	}
	if p.names.Cluster {
		return p.publishSharded(ctx, s, msg)
	}
	written, err = rediswrite.WriteStream(ctx, p.client, p.names, s, 0, p.names.Channel(s.TenantID), msg, p.streamMaxLen)
	if err != nil {
		return false, p.refused(err)
	}
	return written, nil
}

func (p *RedisPublisher) publishSharded(ctx context.Context, s *snapshot.Snapshot, msg []byte) (written bool, err error) {
	out, err := rediswrite.WriteIfNewer(ctx, p.client, p.names, s, 0)
	if err != nil {
		return false, p.refused(err)
	}
	if out == rediswrite.Stale {
		return false, nil
	}
	if p.streamMaxLen > 0 {
		if _, err := rediswrite.Announce(ctx, p.client, p.names, s, out, p.names.Channel(s.TenantID), msg, p.streamMaxLen); err != nil {
			return out == rediswrite.Written, fmt.Errorf("publish %s: announce: %w", s.TaskID, err)
		}
		return out == rediswrite.Written, nil
	}
	if err := p.client.SPublish(ctx, p.names.Channel(s.TenantID), msg).Err(); err != nil {
		return out == rediswrite.Written, fmt.Errorf("publish %s: announce: %w", s.TaskID, err)
	}
	return out == rediswrite.Written, nil
}

// MemoryPublisher is the Publisher of the embedded mode: it stores the
// snapshot in Store and, when Store wrote it, publishes its notification on
// Bus (a nil Bus announces nothing).
type MemoryPublisher struct {
	Store snapshot.Writer
	Bus   *MemoryBus
}

var _ Publisher = MemoryPublisher{}

// Publish stores s if newer and announces it; written is false for a stale
// snapshot.
func (p MemoryPublisher) Publish(ctx context.Context, s *snapshot.Snapshot) (written bool, err error) {
	if s == nil {
		return false, errNilSnapshot
	}
	written, err = p.Store.SetIfNewer(ctx, s)
	if err != nil {
		return false, fmt.Errorf("publish %s: %w", s.TaskID, err)
	}
	if written && p.Bus != nil {
		p.Bus.Publish(snapshot.NotificationFor(s))
	}
	return written, nil
}
