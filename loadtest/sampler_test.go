package main

import (
	"fmt"
	"math"
	"strings"
	"testing"
)

// TestPromLatency reads a histogram's growth between two scrapes: 100
// observations, 40 at most 0.1 ms, 90 at most 0.2 ms, all at most 1 ms.
func TestPromLatency(t *testing.T) {
	scrape := func(n100, n200, n1000, sum float64) metrics {
		return parseMetrics(strings.NewReader(fmt.Sprintf(`stage_seconds_bucket{le="0.0001"} %g
stage_seconds_bucket{le="0.0002"} %g
stage_seconds_bucket{le="0.001"} %g
stage_seconds_bucket{le="+Inf"} %g
stage_seconds_sum %g
stage_seconds_count %g
`, n100, n200, n1000, n1000, sum, n1000)))
	}
	m0 := scrape(7, 9, 10, 0.5)
	m1 := scrape(47, 99, 110, 0.5+0.015)
	l, ok := promLatency(m0, m1, "stage_seconds")
	if !ok {
		t.Fatal("nothing read")
	}
	// The 50th of 100 falls in (0.1, 0.2] ms, the 10th of its 50.
	if l.Count != 100 || math.Abs(l.Mean-0.15) > 1e-9 || math.Abs(l.P50-0.12) > 1e-9 || math.Abs(l.P99-(0.2+0.8*9/10)) > 1e-9 {
		t.Errorf("got %+v, want 100 counted, mean 0.15 ms, p50 0.12 ms, p99 0.92 ms", l)
	}
	if _, ok := promLatency(m1, m1, "stage_seconds"); ok {
		t.Error("nothing counted between equal scrapes, yet a summary")
	}
}

func TestParseMetrics(t *testing.T) {
	m := parseMetrics(strings.NewReader("# HELP go_goroutines x\n# TYPE go_goroutines gauge\ngo_goroutines 42\npushd_mode{mode=\"polling\"} 1\npushd_deliveries_total 1.5e+06\n"))
	if m["go_goroutines"] != 42 || m[`pushd_mode{mode="polling"}`] != 1 || m["pushd_deliveries_total"] != 1.5e6 {
		t.Errorf("parsed %v", m)
	}
}
