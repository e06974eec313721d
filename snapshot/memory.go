package snapshot

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
)

// MemoryStore is the snapshot store of the embedded mode, with no Redis and
// no PostgreSQL: it keeps the newest version of every task it was given, and
// indexes them by project and by user. It is the only source there is, so
// Get returns what it holds even when that is older than atLeast. It keeps
// every task until the process ends. It is safe for concurrent use.
type MemoryStore struct {
	mu       sync.RWMutex
	tasks    map[string]*Snapshot           // guarded by mu
	projects map[scope]map[string]*Snapshot // tenant and project to tasks; guarded by mu
	users    map[scope]map[string]*Snapshot // tenant and user to tasks; guarded by mu
}

// scope names a project or a user of a tenant.
type scope struct{ tenant, id string }

var (
	_ Source = (*MemoryStore)(nil)
	_ Writer = (*MemoryStore)(nil)
)

// NewMemoryStore returns an empty MemoryStore.
func NewMemoryStore() *MemoryStore {
	return &MemoryStore{
		tasks:    make(map[string]*Snapshot),
		projects: make(map[scope]map[string]*Snapshot),
		users:    make(map[scope]map[string]*Snapshot),
	}
}

// Get returns the task's snapshot, or ErrNotFound.
func (m *MemoryStore) Get(_ context.Context, taskID string, _ int64) (*Snapshot, error) {
	if !ValidID(taskID) {
		return nil, ErrInvalidID
	}
	m.mu.RLock()
	defer m.mu.RUnlock()
	if s := m.tasks[taskID]; s != nil {
		return s, nil
	}
	return nil, ErrNotFound
}

// GetMany returns the snapshots of the tasks that exist, keyed by id. It
// accepts at most MaxMany ids; more fail with ErrInvalidID.
func (m *MemoryStore) GetMany(_ context.Context, taskIDs []string) (map[string]*Snapshot, error) {
	if err := CheckMany(taskIDs); err != nil {
		return nil, err
	}
	out := make(map[string]*Snapshot, len(taskIDs))
	m.mu.RLock()
	defer m.mu.RUnlock()
	for _, id := range taskIDs {
		if s := m.tasks[id]; s != nil {
			out[id] = s
		}
	}
	return out, nil
}

// ListProject returns the project's MaxList most recently updated tasks,
// newest first.
func (m *MemoryStore) ListProject(_ context.Context, tenantID, projectID string) ([]*Snapshot, error) {
	if !ValidID(tenantID) || !ValidID(projectID) {
		return nil, ErrInvalidID
	}
	return m.list(m.projects, scope{tenantID, projectID}), nil
}

// ListUser returns the user's MaxList most recently updated tasks, newest
// first.
func (m *MemoryStore) ListUser(_ context.Context, tenantID, userID string) ([]*Snapshot, error) {
	if !ValidID(tenantID) || !ValidID(userID) {
		return nil, ErrInvalidID
	}
	return m.list(m.users, scope{tenantID, userID}), nil
}

func (m *MemoryStore) list(index map[scope]map[string]*Snapshot, sc scope) []*Snapshot {
	m.mu.RLock()
	out := make([]*Snapshot, 0, len(index[sc]))
	for _, s := range index[sc] {
		out = append(out, s)
	}
	m.mu.RUnlock()
	// The order of the PostgreSQL query: newest first, then by id.
	slices.SortFunc(out, func(a, b *Snapshot) int {
		return cmp.Or(cmp.Compare(b.UpdatedAt, a.UpdatedAt), cmp.Compare(a.TaskID, b.TaskID))
	})
	return out[:min(len(out), MaxList)]
}

// Reload is GetMany: a MemoryStore has no cache to bypass.
func (m *MemoryStore) Reload(ctx context.Context, taskIDs []string) (map[string]*Snapshot, error) {
	return m.GetMany(ctx, taskIDs)
}

// Observe does nothing: a MemoryStore has no cache to make stale.
func (m *MemoryStore) Observe(string, int64) {}

// Cached returns the task's snapshot: a MemoryStore has no remote source
// to spare.
func (m *MemoryStore) Cached(taskID string) *Snapshot {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return m.tasks[taskID]
}

// ListCached is always true: a MemoryStore has no remote source to spare.
func (m *MemoryStore) ListCached(string, string, string) bool { return true }

// SetIfNewer stores s unless the store holds the same or a newer version of
// the task, and reports whether it did. A task held as another tenant's
// fails with ErrTenantMismatch, as on Redis.
func (m *MemoryStore) SetIfNewer(_ context.Context, s *Snapshot) (bool, error) {
	if s == nil {
		return false, errors.New("set: nil snapshot")
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	old := m.tasks[s.TaskID]
	if old != nil && old.TenantID != s.TenantID {
		return false, fmt.Errorf("set %s: %w", s.TaskID, ErrTenantMismatch)
	}
	if old != nil && !s.NewerThan(old.Version) {
		return false, nil
	}
	if old != nil {
		unindex(m.projects, scope{old.TenantID, old.ProjectID}, old.TaskID)
		unindex(m.users, scope{old.TenantID, old.UserID}, old.TaskID)
	}
	m.tasks[s.TaskID] = s
	index(m.projects, scope{s.TenantID, s.ProjectID}, s)
	index(m.users, scope{s.TenantID, s.UserID}, s)
	return true, nil
}

// index adds s under sc; a task without a project or user is not listed.
func index(idx map[scope]map[string]*Snapshot, sc scope, s *Snapshot) {
	if sc.id == "" {
		return
	}
	set := idx[sc]
	if set == nil {
		set = make(map[string]*Snapshot)
		idx[sc] = set
	}
	set[s.TaskID] = s
}

func unindex(idx map[scope]map[string]*Snapshot, sc scope, taskID string) {
	set := idx[sc]
	delete(set, taskID)
	if len(set) == 0 {
		delete(idx, sc)
	}
}
