package snapshot_test

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/pushd/pushd/internal/testenv"
	"github.com/pushd/pushd/snapshot"
	"github.com/pushd/pushd/snapshot/snapshottest"
)

// docIn is a snapshot document with a project, user and update time.
func docIn(task, tenant, project, user string, version, updatedAt int64) []byte {
	return fmt.Appendf(nil, `{"task_id":%q,"tenant_id":%q,"project_id":%q,"user_id":%q,"status":"RUNNING","version":%d,"updated_at":%d}`,
		task, tenant, project, user, version, updatedAt)
}

func TestMemoryStoreKeepsNewest(t *testing.T) {
	t.Parallel()
	ctx := testenv.Context(t)
	m := snapshot.NewMemoryStore()
	if _, err := m.Get(ctx, "a", 0); !errors.Is(err, snapshot.ErrNotFound) {
		t.Fatalf("Get of an unknown task: %v, want ErrNotFound", err)
	}
	for _, step := range []struct {
		version int64
		want    bool
		stored  int64
	}{{2, true, 2}, {2, false, 2}, {1, false, 2}, {3, true, 3}} {
		ok, err := m.SetIfNewer(ctx, snapshottest.Snapshot(t, "a", "t1", "RUNNING", step.version))
		if err != nil || ok != step.want {
			t.Errorf("SetIfNewer v%d = %v, %v; want %v", step.version, ok, err, step.want)
		}
		got, err := m.Get(ctx, "a", 0)
		if err != nil || got.Version != step.stored {
			t.Errorf("after v%d Get = %v, %v; want version %d", step.version, got, err, step.stored)
		}
	}
	// The only source: an older version is still the best answer.
	if got, err := m.Get(ctx, "a", 99); err != nil || got.Version != 3 {
		t.Errorf("Get atLeast 99 = %v, %v; want version 3", got, err)
	}
	if _, err := m.SetIfNewer(ctx, nil); err == nil {
		t.Error("SetIfNewer(nil) succeeded")
	}
}

func TestMemoryStoreInvalidIDs(t *testing.T) {
	t.Parallel()
	ctx := testenv.Context(t)
	m := snapshot.NewMemoryStore()
	bad := []string{"", "a b", "a{b}", strings.Repeat("x", snapshot.MaxIDLen+1)}
	for _, id := range bad {
		if _, err := m.Get(ctx, id, 0); !errors.Is(err, snapshot.ErrInvalidID) {
			t.Errorf("Get(%q): %v, want ErrInvalidID", id, err)
		}
		if _, err := m.GetMany(ctx, []string{"ok", id}); !errors.Is(err, snapshot.ErrInvalidID) {
			t.Errorf("GetMany(%q): %v, want ErrInvalidID", id, err)
		}
		if _, err := m.ListProject(ctx, "t1", id); !errors.Is(err, snapshot.ErrInvalidID) {
			t.Errorf("ListProject(%q): %v, want ErrInvalidID", id, err)
		}
		if _, err := m.ListUser(ctx, id, "u1"); !errors.Is(err, snapshot.ErrInvalidID) {
			t.Errorf("ListUser(%q): %v, want ErrInvalidID", id, err)
		}
	}
	many := make([]string, snapshot.MaxMany+1)
	for i := range many {
		many[i] = fmt.Sprint("t", i)
	}
	if _, err := m.GetMany(ctx, many); !errors.Is(err, snapshot.ErrInvalidID) {
		t.Errorf("GetMany of %d ids: %v, want ErrInvalidID", len(many), err)
	}
}

func TestMemoryStoreGetManyAndLists(t *testing.T) {
	t.Parallel()
	ctx := testenv.Context(t)
	m := snapshot.NewMemoryStore()
	set := func(b []byte) {
		t.Helper()
		if _, err := m.SetIfNewer(ctx, snapshottest.MustParse(t, b)); err != nil {
			t.Fatal(err)
		}
	}
	set(docIn("a", "t1", "p1", "u1", 1, 100))
	set(docIn("b", "t1", "p1", "u2", 1, 300))
	set(docIn("c", "t1", "p2", "u1", 1, 200))
	set(docIn("d", "t2", "p1", "u1", 1, 400)) // another tenant's p1 and u1

	got, err := m.GetMany(ctx, []string{"a", "b", "zz", "a"})
	if err != nil || len(got) != 2 || got["a"] == nil || got["b"] == nil {
		t.Fatalf("GetMany = %v, %v; want a and b", got, err)
	}

	ids := func(l []*snapshot.Snapshot) string {
		var s []string
		for _, x := range l {
			s = append(s, fmt.Sprintf("%s@%d", x.TaskID, x.Version))
		}
		return strings.Join(s, ",")
	}
	check := func(name string, l []*snapshot.Snapshot, err error, want string) {
		t.Helper()
		if err != nil || ids(l) != want {
			t.Errorf("%s = %s, %v; want %s", name, ids(l), err, want)
		}
	}
	l, err := m.ListProject(ctx, "t1", "p1")
	check("ListProject t1/p1", l, err, "b@1,a@1")
	l, err = m.ListUser(ctx, "t1", "u1")
	check("ListUser t1/u1", l, err, "c@1,a@1")
	l, err = m.ListProject(ctx, "t2", "p1")
	check("ListProject t2/p1", l, err, "d@1")
	l, err = m.ListProject(ctx, "t1", "nope")
	check("ListProject t1/nope", l, err, "")

	// A new version moves a to another project and user and to the top.
	set(docIn("a", "t1", "p2", "u2", 2, 500))
	l, err = m.ListProject(ctx, "t1", "p1")
	check("ListProject t1/p1 after move", l, err, "b@1")
	l, err = m.ListProject(ctx, "t1", "p2")
	check("ListProject t1/p2 after move", l, err, "a@2,c@1")
	l, err = m.ListUser(ctx, "t1", "u1")
	check("ListUser t1/u1 after move", l, err, "c@1")
	// An older version does not move it back.
	set(docIn("a", "t1", "p1", "u1", 1, 600))
	l, err = m.ListProject(ctx, "t1", "p1")
	check("ListProject t1/p1 after stale write", l, err, "b@1")
}

func TestMemoryStoreConcurrent(t *testing.T) {
	t.Parallel()
	ctx := testenv.Context(t)
	m := snapshot.NewMemoryStore()
	versions := make([]*snapshot.Snapshot, 58)
	for v := range versions[1:] {
		versions[v+1] = snapshottest.MustParse(t, docIn("a", "t1", "p1", "u1", int64(v+1), int64(v+1)))
	}
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Go(func() {
			for v := 1; v <= 50; v++ {
				m.SetIfNewer(ctx, versions[v+w])
				m.Get(ctx, "a", 0)
				m.ListProject(ctx, "t1", "p1")
			}
		})
	}
	wg.Wait()
	if got, err := m.Get(ctx, "a", 0); err != nil || got.Version != 57 {
		t.Fatalf("Get = %v, %v; want version 57", got, err)
	}
}
