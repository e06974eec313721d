package histogram_test

import (
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/pushd/pushd/internal/histogram"
)

func TestBucketsAreInclusiveAndCumulative(t *testing.T) {
	h := histogram.New(time.Millisecond, time.Second)
	for _, d := range []time.Duration{-time.Second, time.Millisecond, time.Millisecond + 1, 2 * time.Millisecond, time.Second, time.Minute} {
		h.Observe(d)
	}
	s := h.Snapshot()
	want := histogram.Snapshot{
		Bounds:     []time.Duration{time.Millisecond, time.Second},
		Cumulative: []uint64{2, 5},
		Count:      6,
		Sum:        time.Minute + time.Second + 4*time.Millisecond + 1,
	}
	if !slices.Equal(s.Bounds, want.Bounds) || !slices.Equal(s.Cumulative, want.Cumulative) || s.Count != want.Count || s.Sum != want.Sum {
		t.Fatalf("snapshot %+v, want %+v", s, want)
	}
}

func TestBoundsAreCopied(t *testing.T) {
	bounds := []time.Duration{time.Millisecond, time.Second}
	h := histogram.New(bounds...)
	bounds[0] = time.Hour
	h.Snapshot().Bounds[1] = time.Hour
	h.Observe(2 * time.Millisecond)
	if s := h.Snapshot(); s.Bounds[0] != time.Millisecond || s.Bounds[1] != time.Second || s.Cumulative[0] != 0 || s.Cumulative[1] != 1 {
		t.Fatalf("snapshot %+v after its bounds were written to", s)
	}
}

func TestBoundsMustIncrease(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Fatal("New accepted bounds out of order")
		}
	}()
	histogram.New(time.Second, time.Millisecond)
}

// TestConcurrentObserve counts every observation of concurrent observers,
// and a snapshot taken meanwhile is consistent: cumulative counts never
// exceed the total.
func TestConcurrentObserve(t *testing.T) {
	h := histogram.New(time.Millisecond, time.Second)
	const observers, each = 4, 1000
	var wg sync.WaitGroup
	for range observers {
		wg.Go(func() {
			for i := range each {
				h.Observe(time.Duration(i) * time.Millisecond)
			}
		})
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	for reading := true; reading; {
		select {
		case <-done:
			reading = false
		default:
		}
		s := h.Snapshot()
		if s.Cumulative[0] > s.Cumulative[1] || s.Cumulative[1] > s.Count {
			t.Fatalf("inconsistent snapshot %+v", s)
		}
	}
	s := h.Snapshot()
	if s.Count != observers*each || s.Cumulative[0] != observers*2 || s.Cumulative[1] != observers*each {
		t.Fatalf("snapshot %+v after %d observations", s, observers*each)
	}
}

// bounds are the hub's staleness buckets, the longer of its two.
var bounds = []time.Duration{
	5 * time.Millisecond, 10 * time.Millisecond, 25 * time.Millisecond, 50 * time.Millisecond,
	100 * time.Millisecond, 250 * time.Millisecond, 500 * time.Millisecond, time.Second,
	2500 * time.Millisecond, 5 * time.Second, 10 * time.Second, 30 * time.Second,
	time.Minute, 2 * time.Minute, 5 * time.Minute,
}

// BenchmarkObserve compares Observe with client_golang's, the alternative
// this package was chosen over: a typical observation (tens of
// milliseconds) and the worst case (past every bound).
func BenchmarkObserve(b *testing.B) {
	seconds := make([]float64, len(bounds))
	for i, d := range bounds {
		seconds[i] = d.Seconds()
	}
	for _, d := range []time.Duration{30 * time.Millisecond, time.Hour} {
		b.Run("histogram/"+d.String(), func(b *testing.B) {
			h := histogram.New(bounds...)
			b.ReportAllocs()
			for b.Loop() {
				h.Observe(d)
			}
		})
		b.Run("client_golang/"+d.String(), func(b *testing.B) {
			h := prometheus.NewHistogram(prometheus.HistogramOpts{Name: "x", Help: "x", Buckets: seconds})
			b.ReportAllocs()
			for b.Loop() {
				h.Observe(d.Seconds())
			}
		})
		b.Run("histogram/parallel/"+d.String(), func(b *testing.B) {
			h := histogram.New(bounds...)
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					h.Observe(d)
				}
			})
		})
		b.Run("client_golang/parallel/"+d.String(), func(b *testing.B) {
			h := prometheus.NewHistogram(prometheus.HistogramOpts{Name: "x", Help: "x", Buckets: seconds})
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					h.Observe(d.Seconds())
				}
			})
		})
	}
}
