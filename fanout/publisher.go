package fanout

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync/atomic"

	"github.com/redis/go-redis/v9"

	"github.com/pushd/pushd/keys"
	"github.com/pushd/pushd/snapshot"
	"github.com/pushd/pushd/snapshot/rediswrite"
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
// and the tenant's channel, in the tenant's, cannot be one script; nor can
// they with NewSplitRedisPublisher (the snapshot on the cache Redis, the
// channel on the realtime one). Then a publish takes three steps: it
// journals the publish in the tenant's slot (rediswrite.Journal), writes the
// snapshot (rediswrite.WriteIfNewer), and announces it with one script in
// the tenant's slot that also removes the journal entry (rediswrite.Announce;
// with WithStream it appends to the tenant's stream too). A publisher that
// dies between the write and the announcement leaves the entry, and the
// nodes' reconcile (converge.Reconciler) announces the stored version. It
// announces only a version that is stored, and announces a version stored
// by an earlier call again, so a caller that retries after a failed
// announcement reaches the watchers; a retry appends no second stream
// entry for a version whose first one is still among the stream's newest.
//
// A snapshot of a task that Redis holds as another tenant's is refused
// with snapshot.ErrTenantMismatch, one whose stored document cannot be read
// with snapshot.ErrStoredUnreadable: neither is stored nor announced, and
// Stats counts both.
type RedisPublisher struct {
	// snapshots is where snapshots are stored, realtime where they are
	// announced: one client but with NewSplitRedisPublisher.
	snapshots, realtime RedisClient
	names               keys.Names
	threeStep           bool  // the snapshot and the channel cannot be one script
	streamMaxLen        int64 // > 0: append to the tenant's stream, trimmed to about this many entries

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
	p := &RedisPublisher{snapshots: client, realtime: client, names: names, threeStep: names.Cluster}
	for _, o := range opts {
		o(p)
	}
	return p
}

// NewSplitRedisPublisher returns a publisher for standalone Redis with the
// cache and realtime roles on two servers: snapshots are stored on cache,
// and journaled and announced (PUBLISH) on realtime, in the three steps of
// a cluster's publish. WithStream is not for it: the nodes' streams need
// both roles on one Redis.
func NewSplitRedisPublisher(cache, realtime RedisClient, names keys.Names, opts ...PublisherOption) *RedisPublisher {
	p := &RedisPublisher{snapshots: cache, realtime: realtime, names: names, threeStep: true}
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
	msg, err := notificationMessage(s)
	if err != nil {
		return false, fmt.Errorf("publish %s: %w", s.TaskID, err)
	}
	if p.threeStep {
		return p.publishThreeSteps(ctx, s, msg)
	}
	written, err = rediswrite.WriteStream(ctx, p.snapshots, p.names, s, 0, p.names.Channel(s.TenantID), msg, p.streamMaxLen)
	if err != nil {
		return false, p.refused(err)
	}
	return written, nil
}

// Announce announces s again, a version stored already whose writer may
// never have announced it: the hint on the tenant's channel and, with a
// stream, an entry unless one of the stream's newest has this version. It
// stores nothing: a snapshot newer than the stored one is Publish's.
func (p *RedisPublisher) Announce(ctx context.Context, s *snapshot.Snapshot) error {
	if s == nil {
		return errNilSnapshot
	}
	msg, err := notificationMessage(s)
	if err != nil {
		return fmt.Errorf("announce %s: %w", s.TaskID, err)
	}
	return p.announce(ctx, s, rediswrite.Current, rediswrite.Pending{}, msg)
}

// notificationMessage is the hint announcing s.
func notificationMessage(s *snapshot.Snapshot) ([]byte, error) {
	return json.Marshal(snapshot.NotificationFor(s))
}

// publishThreeSteps is Publish where the snapshot and the channel are in
// two slots or on two servers: journal, write, announce (see RedisPublisher).
func (p *RedisPublisher) publishThreeSteps(ctx context.Context, s *snapshot.Snapshot, msg []byte) (written bool, err error) {
	pending, err := p.journal(ctx, s)
	if err != nil {
		return false, err
	}
	out, err := p.write(ctx, s, pending)
	if err != nil || out == rediswrite.Stale {
		return false, err
	}
	if err := p.announce(ctx, s, out, pending, msg); err != nil {
		return out == rediswrite.Written, err
	}
	return out == rediswrite.Written, nil
}

// journal is the first step: the publish recorded as pending in the
// tenant's slot, before anything is stored.
func (p *RedisPublisher) journal(ctx context.Context, s *snapshot.Snapshot) (rediswrite.Pending, error) {
	pending, err := rediswrite.Journal(ctx, p.realtime, p.names, s)
	if err != nil {
		return pending, fmt.Errorf("publish %s: %w", s.TaskID, err)
	}
	return pending, nil
}

// write is the second step, the snapshot's conditional write. A stale or
// refused write is never announced, so it removes its own journal entry;
// one whose reply was lost leaves it, for a retry or the reconcile.
func (p *RedisPublisher) write(ctx context.Context, s *snapshot.Snapshot, pending rediswrite.Pending) (rediswrite.Outcome, error) {
	out, err := rediswrite.WriteIfNewer(ctx, p.snapshots, p.names, s, 0)
	if out == rediswrite.Written || out == rediswrite.Current {
		return out, nil
	}
	if err != nil && out != rediswrite.TenantMismatch && out != rediswrite.Unreadable {
		return out, fmt.Errorf("publish: %w", err)
	}
	if _, ferr := rediswrite.Forget(ctx, p.realtime, p.names, s.TenantID, pending); ferr != nil && err == nil {
		// The entry stays; a node's reconcile removes it, finding this
		// version not newer than the stored one.
		return out, fmt.Errorf("publish %s: %w", s.TaskID, ferr)
	}
	if err != nil {
		return out, p.refused(err)
	}
	return out, nil
}

// announce is the third step: the hint (and the stream entry) published and
// the journal entry removed, in one script in the tenant's slot.
func (p *RedisPublisher) announce(ctx context.Context, s *snapshot.Snapshot, out rediswrite.Outcome, pending rediswrite.Pending, msg []byte) error {
	_, err := rediswrite.Announce(ctx, p.realtime, p.names, rediswrite.Announcement{
		Snapshot: s, Outcome: out, Pending: pending,
		Channel: p.names.Channel(s.TenantID), Message: msg, StreamMaxLen: p.streamMaxLen,
	})
	if err != nil {
		return fmt.Errorf("publish %s: announce: %w", s.TaskID, err)
	}
	return nil
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
