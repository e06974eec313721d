package main

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"
)

// fleet is the pushd nodes under test: one or more (-nodes) on standalone
// Redis, three (or -nodes) on a Redis Cluster. Clients spread over them by
// connection; what the run measures of the server (CPU, RSS, /metrics) is
// summed over them, and some of it also kept node by node.
type fleet []*serverProc

// indexes lists every node's index.
func (f fleet) indexes() []int {
	is := make([]int, len(f))
	for i := range is {
		is[i] = i
	}
	return is
}

func (f fleet) urls() []string {
	out := make([]string, len(f))
	for i, s := range f {
		out[i] = s.baseURL()
	}
	return out
}

// each runs fn on every node at once and returns the first error.
func (f fleet) each(fn func(s *serverProc) error) error {
	errs := make([]error, len(f))
	var wg sync.WaitGroup
	for i, s := range f {
		wg.Go(func() { errs[i] = fn(s) })
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			return fmt.Errorf("node %d: %w", i, err)
		}
	}
	return nil
}

func (f fleet) start(ctx context.Context) error {
	return f.each(func(s *serverProc) error { _, err := s.start(ctx); return err })
}

// startAccepting starts every node and returns the moment the last of them
// first accepted a connection: when every client has its node back.
func (f fleet) startAccepting(ctx context.Context) (time.Time, error) {
	var mu sync.Mutex
	var last time.Time
	err := f.each(func(s *serverProc) error {
		t, err := s.startAccepting(ctx)
		mu.Lock()
		if t.After(last) {
			last = t
		}
		mu.Unlock()
		return err
	})
	return last, err
}

func (f fleet) stop(timeout time.Duration) {
	f.each(func(s *serverProc) error { s.stop(timeout); return nil })
}

func (f fleet) kill() {
	for _, s := range f {
		s.kill()
	}
}

// cpu is each running node's CPU time in clock ticks.
func (f fleet) cpu() []int64 {
	out := make([]int64, len(f))
	for i, s := range f {
		if p := s.current(); p != nil {
			out[i] = procCPU(p.pid())
		}
	}
	return out
}

// kernelCPU is the running nodes' system time in clock ticks, together.
func (f fleet) kernelCPU() int64 {
	var t int64
	for _, s := range f {
		if p := s.current(); p != nil {
			_, sys := procTimes(p.pid())
			t += sys
		}
	}
	return t
}

// rss is each running node's resident set in KB.
func (f fleet) rss() []int64 {
	out := make([]int64, len(f))
	for i, s := range f {
		if p := s.current(); p != nil && !p.exited() {
			out[i] = procRSS(p.pid())
		}
	}
	return out
}

// scrape reads every node's /metrics and adds the series up: counters and
// gauges such as connections and goroutines are the fleet's. It fails if
// any node does not answer.
func (f fleet) scrape(ctx context.Context) (metrics, error) {
	each, err := f.scrapeEach(ctx)
	if err != nil {
		return nil, err
	}
	return sumMetrics(each), nil
}

// sumMetrics adds every series up over the scrapes.
func sumMetrics(each []metrics) metrics {
	sum := metrics{}
	for _, m := range each {
		for k, v := range m {
			sum[k] += v
		}
	}
	return sum
}

// scrapeEach reads every node's /metrics.
func (f fleet) scrapeEach(ctx context.Context) ([]metrics, error) {
	out := make([]metrics, len(f))
	for i, s := range f {
		var m metrics
		var err error
		for _, base := range s.adminURLs() {
			if m, err = scrape(ctx, base); err == nil {
				break
			}
		}
		if err != nil {
			return nil, fmt.Errorf("node %d: %w", i, err)
		}
		out[i] = m
	}
	return out, nil
}

// logTail is the end of every node's log.
func (f fleet) logTail() string {
	if len(f) == 1 {
		return f[0].logTail()
	}
	var parts []string
	for i, s := range f {
		if t := s.logTail(); t != "" {
			parts = append(parts, fmt.Sprintf("node %d:\n%s", i, t))
		}
	}
	return strings.Join(parts, "\n")
}
