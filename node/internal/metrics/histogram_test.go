package metrics

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/pushd/pushd/admission"
	"github.com/pushd/pushd/fanout"
	"github.com/pushd/pushd/hub"
	"github.com/pushd/pushd/internal/testenv"
	"github.com/pushd/pushd/snapshot"
	"github.com/pushd/pushd/snapshot/snapshottest"
	"github.com/pushd/pushd/stream"
)

// taskSink is a hub.Sink that hands over the task events written to it.
type taskSink chan *snapshot.Snapshot

func (s taskSink) Write(evs []hub.Event) (bool, error) {
	for _, ev := range evs {
		if ev.Kind == hub.KindTask {
			s <- ev.Snapshot
		}
	}
	return false, nil
}
func (taskSink) Closed(hub.CloseReason) {}
func (taskSink) Bind(*hub.Conn)         {}

// TestHistogramsServeTheirBucketsAndObservations pins the histograms'
// bucket bounds, which docs/METRICS.md states and dashboards
// query, and checks an observation of the hub reaches /metrics.
func TestHistogramsServeTheirBucketsAndObservations(t *testing.T) {
	store := snapshot.NewMemoryStore()
	bus := fanout.NewMemoryBus()
	h := hub.New(hub.Config{Source: store, Bus: bus})
	bus.Start(h)
	defer bus.Close()
	defer h.Close()
	tl := stream.NewTailer(stream.Config{Client: testenv.SharedRedis(t).Client})
	defer tl.Close()

	ctx := context.Background()
	store.SetIfNewer(ctx, snapshottest.Snapshot(t, "task_a", "t1", "RUNNING", 1))
	sink := make(taskSink, 2)
	c, err := h.Open(hub.Principal{TenantID: "t1", UserID: "u1"}, sink)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Subscribe(ctx, hub.Subscription{Tasks: []string{"task_a"}}); err != nil {
		t.Fatal(err)
	}
	<-sink // the initial state, which neither histogram measures
	store.SetIfNewer(ctx, snapshottest.Snapshot(t, "task_a", "t1", "RUNNING", 2))
	h.Notify(snapshot.Notification{TenantID: "t1", TaskID: "task_a", Version: 2})
	<-sink
	// The write is measured once it returned, after the sink saw it.
	testenv.Eventually(t, "the change's write measured", func() bool { return h.Stats().Staleness.Count > 0 })

	families, err := NewRegistry(Sources{Hub: h, Stream: tl}).Gather()
	if err != nil {
		t.Fatal(err)
	}
	notified := []float64{.000025, .00005, .0001, .00015, .0002, .0003, .0005, .00075, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10}
	want := map[string]struct {
		bounds []float64
		count  uint64
	}{
		// The notification's one task: queued once, read once, written once.
		"pushd_notification_to_write_seconds": {notified, 1},
		"pushd_notification_queued_seconds":   {notified, 1},
		"pushd_notification_read_seconds":     {notified, 1},
		"pushd_snapshot_staleness_seconds":    {[]float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120, 300}, 1},
		"pushd_stream_lag_seconds":            {[]float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10}, 0},
	}
	for _, f := range families {
		w, ok := want[f.GetName()]
		if !ok {
			continue
		}
		delete(want, f.GetName())
		m := f.GetMetric()[0].GetHistogram()
		var bounds []float64
		for _, b := range m.GetBucket() {
			bounds = append(bounds, b.GetUpperBound())
		}
		if !slices.Equal(bounds, w.bounds) {
			t.Errorf("%s buckets %v, want %v", f.GetName(), bounds, w.bounds)
		}
		if m.GetSampleCount() != w.count {
			t.Errorf("%s count %d, want %d", f.GetName(), m.GetSampleCount(), w.count)
		}
		// The change was written long after its updated_at: past every
		// bound.
		if b := m.GetBucket(); f.GetName() == "pushd_snapshot_staleness_seconds" &&
			(b[len(b)-1].GetCumulativeCount() != 0 || m.GetSampleSum() < (24*time.Hour).Seconds()) {
			t.Errorf("staleness %v: want one observation past every bound", m)
		}
	}
	for name := range want {
		t.Errorf("%s not served", name)
	}
}

// TestRateLimitHistogramsInMilliseconds pins the rate-limit histograms'
// bounds, in milliseconds as their names say, and checks a refusal's wait
// reaches rate_limit_retry_after_ms exactly, under its endpoint and rule.
func TestRateLimitHistogramsInMilliseconds(t *testing.T) {
	h := hub.New(hub.Config{Source: snapshot.NewMemoryStore(), Bus: fanout.NewMemoryBus()})
	defer h.Close()
	adm := admission.New(admission.Config{ConnectUserBurst: 1, ConnectUserRate: 1})
	defer adm.Close()
	ctx := context.Background()
	hold, d := adm.Connect(ctx, "t1", "u1", "", "")
	if !d.Allowed {
		t.Fatalf("1st connect: %+v", d)
	}
	defer hold.Release()
	_, d = adm.Connect(ctx, "t1", "u1", "", "")
	if d.Allowed || d.RetryAfter <= 0 {
		t.Fatalf("2nd connect: %+v, want refused with a wait", d)
	}

	families, err := NewRegistry(Sources{Hub: h, Admission: adm}).Gather()
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]struct {
		bounds []float64
		count  uint64
		sum    float64
	}{
		"rate_limit_retry_after_ms": {[]float64{10, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000, 60000, 300000, 900000, 3600000}, 1, float64(d.RetryAfter) / float64(time.Millisecond)},
		"rate_limit_lua_latency_ms": {[]float64{.1, .25, .5, 1, 2.5, 5, 10, 25, 50, 100, 250, 500, 1000}, 0, 0}, // no Redis: no round trip
	}
	for _, f := range families {
		w, ok := want[f.GetName()]
		if !ok {
			continue
		}
		delete(want, f.GetName())
		if n := len(f.GetMetric()); n != 1 {
			t.Fatalf("%s: %d series, want connect_user's only", f.GetName(), n)
		}
		m := f.GetMetric()[0]
		labels := map[string]string{}
		for _, l := range m.GetLabel() {
			labels[l.GetName()] = l.GetValue()
		}
		if labels["endpoint"] != admission.EndpointConnect || labels["rule_name"] != admission.RuleConnectUser || len(labels) != 2 {
			t.Errorf("%s labels %v", f.GetName(), labels)
		}
		var bounds []float64
		for _, b := range m.GetHistogram().GetBucket() {
			bounds = append(bounds, b.GetUpperBound())
		}
		if !slices.Equal(bounds, w.bounds) {
			t.Errorf("%s buckets %v, want %v", f.GetName(), bounds, w.bounds)
		}
		if got := m.GetHistogram(); got.GetSampleCount() != w.count || got.GetSampleSum() != w.sum {
			t.Errorf("%s count %d sum %g, want %d and %g", f.GetName(), got.GetSampleCount(), got.GetSampleSum(), w.count, w.sum)
		}
	}
	for name := range want {
		t.Errorf("%s not served", name)
	}
}
