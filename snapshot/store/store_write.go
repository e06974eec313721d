package store

import (
	"context"
	"errors"
	"fmt"

	"github.com/pushd/pushd/snapshot"
	"github.com/pushd/pushd/snapshot/rediswrite"
)

// countRefusal counts a write the script refused, and returns err.
func (s *Store) countRefusal(err error) error {
	switch {
	case errors.Is(err, snapshot.ErrTenantMismatch):
		s.stats.tenantMismatches.Add(1)
	case errors.Is(err, snapshot.ErrStoredUnreadable):
		s.stats.unreadableStored.Add(1)
	}
	return err
}

// SetIfNewer writes s to Redis with the TTL its status calls for, if Redis
// holds no newer version, and caches it in process. It fails with
// ErrUnavailable when the Store has no Redis, and with ErrTenantMismatch or
// ErrStoredUnreadable when the write script refused it (see
// rediswrite.Write); a refused snapshot is not cached.
func (s *Store) SetIfNewer(ctx context.Context, snap *snapshot.Snapshot) (bool, error) {
	if snap == nil {
		return false, errors.New("set: nil snapshot")
	}
	if s.rdb == nil {
		return false, fmt.Errorf("set %s: %w: no redis", snap.TaskID, snapshot.ErrUnavailable)
	}
	written, err := rediswrite.Write(ctx, s.rdb, s.names, snap, snapshot.TTLWithJitter(snap.Status), "", nil)
	if err != nil {
		return false, s.countRefusal(err)
	}
	// Even when Redis held a newer version, snap is a real version of a
	// task that exists: remember keeps the newer of it and the cached one.
	s.remember(snap)
	return written, nil
}
