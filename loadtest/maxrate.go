package main

import (
	"context"
	"fmt"
	"io"
	"math"
	"os"
)

// The highest rate a server holds is found by fan-out runs at rising rates:
// doubling from -rate while it holds, then halving the gap between the
// highest rate held and the lowest one missed until the gap is at most
// maxRateStep of the rate held, or maxRateProbes runs were made.
const (
	maxRateStep   = 0.1
	maxRateProbes = 10
	// heldP99MS is the delivery p99 a held rate keeps.
	heldP99MS = 100
	// heldShare is how much of what was asked must arrive, of both the
	// publishes and the deliveries: a rate whose publisher fell behind
	// measured less than it asked for.
	heldShare = 0.99
)

// held reports whether a fan-out run held its rate: it converged with no
// problem, delivered every update (heldShare of what was asked, which
// conflation would fall short of) with p99 ≤ heldP99MS, and its publisher
// kept up. why says what fell short.
func held(res *result, rate float64) (ok bool, why string) {
	fig := func(name string) float64 {
		for _, f := range res.Figures {
			if f.Name == name {
				return f.Value
			}
		}
		return math.NaN()
	}
	lat := res.Latencies["delivery"]
	switch got, asked := fig("deliveries_per_s"), fig("deliveries_asked_per_s"); {
	case !res.OK:
		return false, "the run failed"
	case !(fig("publishes_per_s") >= heldShare*rate):
		return false, fmt.Sprintf("published %.0f/s of %.0f/s", fig("publishes_per_s"), rate)
	case !(got >= heldShare*asked):
		return false, fmt.Sprintf("delivered %.0f/s of %.0f/s", got, asked)
	case lat == nil || lat.P99 > heldP99MS:
		return false, fmt.Sprintf("p99 %.1f ms", lat.P99)
	}
	return true, ""
}

// nextRate is the next rate to try after the runs so far, given the
// highest rate held (0 for none) and the lowest missed (0 for none); done
// says the search is over.
func nextRate(start, hi, lo float64, probes int) (rate float64, done bool) {
	switch {
	case probes >= maxRateProbes:
		return 0, true
	case hi == 0 && lo == 0:
		return start, false
	case lo == 0:
		return 2 * hi, false
	case hi == 0:
		if lo/2 < 1 {
			return 0, true
		}
		return lo / 2, false // not even -rate held: look below it
	case lo-hi <= maxRateStep*hi:
		return 0, true
	}
	return math.Round((hi + lo) / 2), false
}

// findMax runs cfg's fan-out at rising rates and returns every run, the
// last one carrying max_held_rate and max_held_deliveries_per_s, and
// whether any rate held.
func findMax(ctx context.Context, cfg config, bin, commit, dir string, stdout, stderr io.Writer) ([]*result, bool) {
	var (
		runs   []*result
		hi, lo float64
		best   *result
	)
	for i := 0; ; i++ {
		rate, done := nextRate(cfg.Rate, hi, lo, i)
		if done || ctx.Err() != nil {
			break
		}
		c := cfg
		c.Rate = rate
		pdir := fmt.Sprintf("%s-probe%d", dir, i)
		os.MkdirAll(pdir, 0o755)
		res, _ := runOne(ctx, c, bin, commit, pdir, stderr) // an error is in res.Problems
		ok, why := held(res, rate)
		verdict := "held"
		if !ok {
			verdict = "missed: " + why
		}
		fmt.Fprintf(stderr, "loadtest: %s at %.0f updates/s: %s\n", cfg.Target, rate, verdict)
		fmt.Fprintln(stdout, res.row())
		runs = append(runs, res)
		if ok {
			hi, best = rate, res
		} else {
			lo = rate
		}
	}
	if len(runs) == 0 {
		return nil, false
	}
	last := runs[len(runs)-1]
	watchers := float64(cfg.Conns) / float64(cfg.Tasks)
	last.fig("max_held_rate", hi, "updates/s", true)
	last.fig("max_held_deliveries_per_s", hi*watchers, "/s", true)
	if best != nil {
		fmt.Fprintf(stderr, "loadtest: %s holds %.0f updates/s (%.0f deliveries/s)\n", cfg.Target, hi, hi*watchers)
	} else {
		fmt.Fprintf(stderr, "loadtest: %s held none of the rates tried\n", cfg.Target)
	}
	return runs, best != nil
}
