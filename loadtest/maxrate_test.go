package main

import "testing"

// The search ends within maxRateStep below the true limit, never above it,
// whether -rate starts below the limit or above it.
func TestFindMaxSearch(t *testing.T) {
	for _, tc := range []struct{ start, limit float64 }{
		{1000, 3300}, {1000, 1000}, {1000, 999}, {500, 41000}, {8000, 700},
	} {
		var hi, lo float64
		probes := 0
		for {
			rate, done := nextRate(tc.start, hi, lo, probes)
			if done {
				break
			}
			probes++
			if rate <= tc.limit {
				hi = rate
			} else {
				lo = rate
			}
		}
		if hi > tc.limit || hi < (1-2*maxRateStep)*tc.limit {
			t.Errorf("start %g, limit %g: found %g after %d probes", tc.start, tc.limit, hi, probes)
		}
	}
}

func TestHeld(t *testing.T) {
	res := func(ok bool, pub, got, p99 float64) *result {
		r := &result{OK: ok, Latencies: map[string]*latencySummary{"delivery": {P99: p99}}}
		r.fig("publishes_per_s", pub, "/s", false)
		r.fig("deliveries_per_s", got, "/s", false)
		r.fig("deliveries_asked_per_s", 10000, "/s", false)
		return r
	}
	for _, tc := range []struct {
		name string
		res  *result
		want bool
	}{
		{"held", res(true, 1000, 9995, 40), true},
		{"failed run", res(false, 1000, 9995, 40), false},
		{"publisher behind", res(true, 900, 9995, 40), false},
		{"deliveries short", res(true, 1000, 9000, 40), false},
		{"tail", res(true, 1000, 9995, 140), false},
	} {
		if got, why := held(tc.res, 1000); got != tc.want {
			t.Errorf("%s: held %v (%s), want %v", tc.name, got, why, tc.want)
		}
	}
}
