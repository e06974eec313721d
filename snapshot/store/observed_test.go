package store_test

import (
	"testing"

	"github.com/pushd/pushd/internal/testenv"
	"github.com/pushd/pushd/snapshot/store"
)

// TestReadBeforeAnAnnouncementIsNotCached: a read sent before a newer
// version was announced answers what it read, but does not stay in the
// cache, where GetMany and the refreshes that trust it would answer it
// after the announcement.
func TestReadBeforeAnAnnouncementIsNotCached(t *testing.T) {
	t.Parallel()
	e := newEnv(t, store.Config{})
	id := testenv.UniqueID("task")
	e.insert(t, id, "RUNNING", 2) // PostgreSQL only: the read waits there
	// The announcement of version 3 arrives while the query is on its way.
	store.OnDBReadRegistered(e.store, func() { e.store.Observe(id, 3) })

	got, err := e.store.GetMany(testenv.Context(t), []string{id})
	if err != nil || got[id] == nil || got[id].Version != 2 {
		t.Fatalf("GetMany = %v, %v; want version 2 as read", got, err)
	}
	if c := e.store.Cached(id); c != nil && c.Version < 3 {
		t.Errorf("the cache holds version %d after version 3 was announced", c.Version)
	}
}
