package main

import (
	"io"
	"strings"
	"testing"
	"time"
)

// TestRestartFlags: -kill-node and -roll run fanout on two nodes or more,
// one of them at a time, without -kill-master.
func TestRestartFlags(t *testing.T) {
	for _, args := range [][]string{
		{"-kill-node", "-scenario", "fanout"},
		{"-kill-node", "-scenario", "fanout", "-nodes", "1"},
		{"-kill-node", "-scenario", "storm", "-nodes", "2"},
		{"-kill-node", "-quick", "-nodes", "2"},
		{"-kill-node", "-cluster", "-kill-master", "-scenario", "fanout"},
		{"-kill-node", "-roll", "-scenario", "fanout", "-nodes", "2"},
		{"-kill-node", "-find-max", "-scenario", "fanout", "-nodes", "2"},
		{"-roll", "-scenario", "fanout"},
		{"-roll", "-scenario", "churn", "-nodes", "3"},
		{"-roll", "-scenario", "fanout", "-nodes", "2", "-ping-flooders", "4"},
	} {
		if _, err := parseFlags(args, io.Discard); err == nil {
			t.Errorf("%v: accepted", args)
		}
	}
	for _, args := range [][]string{
		{"-kill-node", "-scenario", "fanout", "-nodes", "2"},
		{"-kill-node", "-scenario", "fanout", "-cluster"},
		{"-roll", "-scenario", "fanout", "-nodes", "3", "-transport", "mixed"},
	} {
		cfg, err := parseFlags(args, io.Discard)
		if err != nil {
			t.Errorf("%v: %v", args, err)
			continue
		}
		if runs := cfg.runs(); len(runs) != 1 || runs[0].KillNode != cfg.KillNode || runs[0].Roll != cfg.Roll {
			t.Errorf("%v: runs %+v", args, runs)
		}
	}
}

// restartConfig is fanout on two nodes at the scale a restart shows in:
// 200 clients, 50 tasks each updated twice a second for 4 s.
func restartConfig() config {
	cfg := tinyConfig("fanout", "sse")
	cfg.Nodes, cfg.Conns, cfg.Tasks, cfg.Rate, cfg.Duration = 2, 200, 50, 100, 4*time.Second
	return cfg
}

// TestKillNode kills node 0 of two halfway through fanout: every client it
// held must have an event from node 1 again, and every client converge
// with no version going backwards (runTiny checks both).
func TestKillNode(t *testing.T) {
	cfg := restartConfig()
	cfg.KillNode = true
	res := runTiny(t, cfg)
	if !strings.Contains(res.row(), "one killed") {
		t.Errorf("the row does not say a node was killed: %s", res.row())
	}
	conns, back := figureOf(t, res, "node_kill_conns"), figureOf(t, res, "node_kill_back_conns")
	if conns <= 0 || back < conns {
		t.Errorf("node 0 held %v clients, %v came back", conns, back)
	}
	if s := figureOf(t, res, "node_kill_back_s"); s <= 0 {
		t.Errorf("node_kill_back_s = %v, want above 0", s)
	}
	if p := res.PerNode["move_p99_ms"]; len(p) != 2 || p[0] != 0 || p[1] <= 0 {
		t.Errorf("move p99 by node %v: want none for the killed node, some for node 1", p)
	}
	figureOf(t, res, "move_p99_ms_other_max")
	figureOf(t, res, "move_pg_reads_per_task")
	figureOf(t, res, "before_kill_publish_wait_p99_ms")
	figureOf(t, res, "move_publish_wait_p99_ms")
	if _, ok := lookupFigure(res, "redis_cmds_per_update"); ok {
		t.Error("per-update costs reported over a restarted node's counters")
	}
}

// TestRoll restarts both nodes in turn during fanout: every client must
// converge with no version going backwards (runTiny checks both).
func TestRoll(t *testing.T) {
	cfg := restartConfig()
	cfg.Roll = true
	res := runTiny(t, cfg)
	took, longest := figureOf(t, res, "roll_s"), figureOf(t, res, "roll_node_s_max")
	if took <= 0 || longest <= 0 || longest > took {
		t.Errorf("roll took %v s, its longest node %v s", took, longest)
	}
	if res.Publish == nil || res.Publish.Seconds < took {
		t.Errorf("the publishing (%+v) did not cover the %v s roll", res.Publish, took)
	}
}
