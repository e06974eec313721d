package snapshot

import "context"

// MaxMany bounds the ids of one GetMany call.
const MaxMany = 100

// MaxList bounds ListProject and ListUser: they return the MaxList most
// recently updated tasks.
const MaxList = 500

// Source reads snapshots. store.Store (Redis and PostgreSQL) and MemoryStore
// (the embedded mode) implement it. Every method validates ids before any
// I/O and returns ErrInvalidID for a bad one.
type Source interface {
	// Get returns the task's snapshot. atLeast is the version a notification
	// announced (0 when none): a cached or stored result older than atLeast
	// is not returned while a newer source may have it, and atLeast > 0
	// overrides the negative cache. It returns ErrNotFound when no source has
	// the task, ErrUnavailable when no source answered.
	Get(ctx context.Context, taskID string, atLeast int64) (*Snapshot, error)
	// GetMany returns the snapshots of the tasks that exist, keyed by id;
	// absent tasks are missing from the map.
	GetMany(ctx context.Context, taskIDs []string) (map[string]*Snapshot, error)
	// Reload is GetMany bypassing in-process caches, for resync and polling:
	// a copy cached while notifications were lost may be stale.
	Reload(ctx context.Context, taskIDs []string) (map[string]*Snapshot, error)
	// ListProject returns the current snapshots of a project's tasks.
	ListProject(ctx context.Context, tenantID, projectID string) ([]*Snapshot, error)
	// ListUser returns the current snapshots of a user's tasks.
	ListUser(ctx context.Context, tenantID, userID string) ([]*Snapshot, error)
	// Observe records that a notification announced this version, so no
	// cached older copy or cached absence is served afterwards. It does no
	// I/O and never blocks.
	Observe(taskID string, version int64)
	// Cached returns the snapshot Get(taskID, 0) would answer without a
	// remote read, or nil (an absence known without one is nil too: whom
	// it may spare a read must not depend on another tenant's tasks), and
	// ListCached reports whether ListProject (projectID set) or ListUser
	// (userID set) would be answered without one. They do no I/O.
	Cached(taskID string) *Snapshot
	ListCached(tenantID, projectID, userID string) bool
}

// Writer stores snapshots, keeping versions monotonic.
type Writer interface {
	// SetIfNewer stores s only if no snapshot of the task is stored or the
	// stored version is lower, and clears the task's negative cache. It
	// reports whether it wrote. A task stored as another tenant's is never
	// overwritten: that fails with ErrTenantMismatch.
	SetIfNewer(ctx context.Context, s *Snapshot) (bool, error)
}
