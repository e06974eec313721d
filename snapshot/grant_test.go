package snapshot_test

import (
	"fmt"
	"testing"

	"github.com/pushd/pushd/snapshot"
)

func TestGrant(t *testing.T) {
	own := &snapshot.Snapshot{TenantID: "t1", TaskID: "a", ProjectID: "p9", UserID: "u1"}
	inP1 := &snapshot.Snapshot{TenantID: "t1", TaskID: "b", ProjectID: "p1", UserID: "u2"}
	noProject := &snapshot.Snapshot{TenantID: "t1", TaskID: "c", UserID: "u2"}
	for _, tc := range []struct {
		projects []string
		want     [3]bool // own, inP1, noProject
	}{
		{nil, [3]bool{true, false, false}},
		{[]string{"p1"}, [3]bool{true, true, false}},
		{[]string{"p2", "p1", "p1"}, [3]bool{true, true, false}},
		{[]string{"*"}, [3]bool{true, true, true}},
	} {
		g, err := snapshot.ParseGrant(tc.projects)
		if err != nil {
			t.Fatal(err)
		}
		for i, s := range []*snapshot.Snapshot{own, inP1, noProject} {
			if got := g.Allows("u1", s); got != tc.want[i] {
				t.Errorf("grant %v allows %s: %v, want %v", tc.projects, s.TaskID, got, tc.want[i])
			}
		}
	}
	many := make([]string, snapshot.MaxGrantProjects+1)
	for i := range many {
		many[i] = fmt.Sprintf("p%d", i)
	}
	for _, bad := range [][]string{{"p1", "*"}, {""}, {"p 1"}, many} {
		if _, err := snapshot.ParseGrant(bad); err == nil {
			t.Errorf("ParseGrant(%q) accepted", bad)
		}
	}
}
