package main

import (
	"fmt"
	"testing"
	"time"

	"github.com/pushd/pushd/internal/testenv"
	"github.com/pushd/pushd/snapshot"
)

// The node that reads the fleet's changes (--read-changes) is killed with
// SIGKILL: the other takes the lease within 5 s (the lease's 3 s TTL and
// the 1 s between tries), and every row committed from the kill on, while
// nobody listened, reaches a browser on the surviving node, in order.
func TestChangeReaderKilledIsReplaced(t *testing.T) {
	r := testenv.SharedRedis(t)
	pg := testenv.Database(t)
	var nodes []*proc
	for i := range 2 {
		nodes = append(nodes, startBinary(t, "--redis-url", r.URL, "--key-prefix", r.Names.Prefix, "--database-url", pg.URL,
			"--jwt-secret", fleetSecret, "--read-changes", "--node-name", fmt.Sprintf("reader%d", i)))
	}
	leader := -1
	testenv.Eventually(t, "one node reads the changes", func() bool {
		leader = -1
		for i, n := range nodes {
			if testenv.Scrape(t, n.AdminURL)["pushd_change_reader_leading"] == 1 {
				if leader >= 0 {
					return false
				}
				leader = i
			}
		}
		return leader >= 0
	})
	dead, survivor := nodes[leader], nodes[1-leader]

	tenant, task := testenv.UniqueID("t"), testenv.UniqueID("task")
	commit := func(version int64) {
		pg.InsertTask(t, testenv.Task{ID: task, TenantID: tenant, ProjectID: "p1", UserID: "u1", Status: "RUNNING", Version: version})
	}
	commit(1)
	sse := openSSE(t, survivor.URL, "/v1/events?task="+task, fleetToken(t, tenant))
	next := func() *snapshot.Snapshot {
		t.Helper()
		s, err := snapshot.Parse([]byte(sse.NextOf(t, "task").Data))
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	if s := next(); s.Version != 1 {
		t.Fatalf("first event v%d, want v1", s.Version)
	}

	if err := dead.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	<-dead.exited
	for v := int64(2); v <= 5; v++ {
		commit(v)
	}
	testenv.Eventually(t, "the survivor reads the changes", func() bool {
		return testenv.Scrape(t, survivor.AdminURL)["pushd_change_reader_leading"] == 1
	})
	took := time.Since(killed)
	t.Logf("the survivor took over %v after the kill", took.Round(time.Millisecond))
	if took > 5*time.Second {
		t.Errorf("the survivor took over %v after the kill, want within 5s", took.Round(time.Millisecond))
	}
	for last := int64(1); last < 5; {
		s := next()
		if s.Version <= last {
			t.Fatalf("v%d after v%d", s.Version, last)
		}
		last = s.Version
	}
	// The survivor listed the gap's commits on taking the lease. A repair
	// round whose slot fell in the gap (one in four, with the 10 s
	// interval and a 2.5 s gap past the repair's grace) may have published
	// the row first: both converge, and the catch-up's count shows the
	// reader did its part either way.
	if m := testenv.Scrape(t, survivor.AdminURL); m[`pushd_changes_read_total{how="caught_up"}`] < 1 {
		t.Errorf("caught up %v rows: want the commits of the gap listed on taking the lease", m[`pushd_changes_read_total{how="caught_up"}`])
	}
}
