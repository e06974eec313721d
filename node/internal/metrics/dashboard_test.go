package metrics

import (
	"encoding/json"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

const dashboardPath = "../../../deploy/grafana/pushd-dashboard.json"

// exported is every metric name a node's registry can serve, with the
// series names its histograms add.
func exported(t *testing.T) map[string]bool {
	t.Helper()
	ch := make(chan *prometheus.Desc, 1024)
	for _, c := range []prometheus.Collector{
		&collector{},
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	} {
		c.Describe(ch)
	}
	close(ch)
	fqName := regexp.MustCompile(`fqName: "([^"]+)"`)
	names := make(map[string]bool)
	for d := range ch {
		m := fqName.FindStringSubmatch(d.String())
		if m == nil {
			t.Fatalf("no name in %s", d)
		}
		names[m[1]] = true
	}
	for _, d := range []*prometheus.Desc{streamLag, notifyWrite, staleness, rlRetryAfter, rlLatency} {
		name := fqName.FindStringSubmatch(d.String())[1]
		for _, suffix := range []string{"_bucket", "_sum", "_count"} {
			names[name+suffix] = true
		}
	}
	return names
}

// queries returns every PromQL expression in the dashboard: panel targets
// and template variable queries, wherever they are nested. A data source
// variable's query is a plugin type, not PromQL.
func queries(v any, key string, out []string) []string {
	switch v := v.(type) {
	case map[string]any:
		if v["type"] == "datasource" {
			return out
		}
		for k, child := range v {
			out = queries(child, k, out)
		}
	case []any:
		for _, child := range v {
			out = queries(child, key, out)
		}
	case string:
		if key == "expr" || key == "query" || key == "definition" {
			out = append(out, v)
		}
	}
	return out
}

var (
	variable    = regexp.MustCompile(`\$\{?\w+\}?`)
	braces      = regexp.MustCompile(`\{[^}]*\}`)
	brackets    = regexp.MustCompile(`\[[^\]]*\]`)
	grouping    = regexp.MustCompile(`\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)`)
	labelValues = regexp.MustCompile(`label_values\(\s*([^,()]+?)\s*,[^)]*\)`)
	identifier  = regexp.MustCompile(`[a-zA-Z_:][a-zA-Z0-9_:]*`)
	keywords    = []string{"and", "or", "unless", "bool", "offset", "by", "without"}
)

// metricNames picks the metric names out of a PromQL expression: what is
// left once label matchers, ranges, groupings and variables are gone, and
// is neither a function call nor a keyword.
func metricNames(expr string) []string {
	s := labelValues.ReplaceAllString(expr, "$1")
	s = variable.ReplaceAllString(s, "")
	s = braces.ReplaceAllString(s, " ")
	s = brackets.ReplaceAllString(s, " ")
	s = grouping.ReplaceAllString(s, " ")
	var out []string
	for _, loc := range identifier.FindAllStringIndex(s, -1) {
		name := s[loc[0]:loc[1]]
		if strings.HasPrefix(strings.TrimSpace(s[loc[1]:]), "(") || slices.Contains(keywords, name) {
			continue
		}
		out = append(out, name)
	}
	return out
}

// TestDashboardQueriesExportedMetrics keeps the Grafana dashboard from
// rotting silently: every metric it queries must be one pushd exports.
func TestDashboardQueriesExportedMetrics(t *testing.T) {
	b, err := os.ReadFile(dashboardPath)
	if err != nil {
		t.Fatal(err)
	}
	var dash map[string]any
	if err := json.Unmarshal(b, &dash); err != nil {
		t.Fatalf("%s: %v", dashboardPath, err)
	}
	names := exported(t)
	exprs := queries(dash, "", nil)
	used := make(map[string]bool)
	for _, e := range exprs {
		found := metricNames(e)
		if len(found) == 0 {
			t.Errorf("query %q names no metric", e)
		}
		for _, n := range found {
			used[n] = true
			if !names[n] {
				t.Errorf("query %q uses %s, which pushd does not export", e, n)
			}
		}
	}
	// What operators watch, each on the dashboard: the platform's names
	// and pushd's own.
	for _, n := range []string{
		"pushd_connections_open", "sse_push_total", "websocket_push_total", "client_reconnect_total",
		"task_snapshot_refetch_total", "pushd_singleflight_shared_total", "pushd_pubsub_received_total",
		"pushd_pubsub_malformed_total", "pushd_pubsub_subscription_losses_total", "pushd_mode",
		"pushd_mode_switches_total", "pushd_stream_lag_seconds_bucket", "stream_length",
		"pushd_disconnects_total", "rate_limit_rejected_total", "rate_limit_allowed_total",
		"rate_limit_retry_after_ms_bucket", "rate_limit_lua_latency_ms_bucket",
		"cache_hit_total", "cache_miss_total", "cache_set_total", "hot_key_detected_total", "pushd_hot_tasks",
		"pubsub_publish_total", "pushd_notifications_unwatched_total", "pushd_stream_apply_errors_total",
		"pushd_admission_lease_events_total", "pushd_admission_reconcile_difference_total",
		"pushd_notification_to_write_seconds_bucket", "pushd_snapshot_staleness_seconds_bucket",
	} {
		if !used[n] {
			t.Errorf("the dashboard does not show %s", n)
		}
	}
}

// TestMetricNames checks the extraction the dashboard test relies on.
func TestMetricNames(t *testing.T) {
	for expr, want := range map[string][]string{
		`sum by (transport, plan) (pushd_connections_open{instance=~"$instance"})`:                                               {"pushd_connections_open"},
		`histogram_quantile(0.99, sum by (le) (rate(pushd_stream_lag_seconds_bucket{instance=~"$instance"}[$__rate_interval])))`: {"pushd_stream_lag_seconds_bucket"},
		`sum(rate(a_total{x="y"}[5m])) / sum(rate(b_total[5m]))`:                                                                 {"a_total", "b_total"},
		`label_values(pushd_connections, instance)`:                                                                              {"pushd_connections"},
	} {
		if got := metricNames(expr); !slices.Equal(got, want) {
			t.Errorf("metricNames(%q) = %q, want %q", expr, got, want)
		}
	}
}
