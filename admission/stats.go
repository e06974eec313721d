package admission

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/pushd/pushd/internal/histogram"
)

// EndpointConnect is the endpoint of Connect's checks (SSE and WebSocket
// connects alike) in Stats.Rules; API's checks carry the endpoint their
// caller names.
const EndpointConnect = "connect"

// EndpointOther stands for the endpoints past maxEndpoints: endpoint names
// come from the callers' code, but a metric label must stay bounded
// whatever a caller passes.
const EndpointOther = "other"

const maxEndpoints = 16

// Bucket bounds of the per-rule histograms.
var (
	// retryAfterBounds bound the waits refusals ask for: under a second
	// for a connect bucket of a few per second, the API window's minute,
	// far longer for a bucket that barely refills.
	retryAfterBounds = [...]time.Duration{
		10 * time.Millisecond, 50 * time.Millisecond, 100 * time.Millisecond, 250 * time.Millisecond,
		500 * time.Millisecond, time.Second, 2500 * time.Millisecond, 5 * time.Second, 10 * time.Second,
		30 * time.Second, time.Minute, 5 * time.Minute, 15 * time.Minute, time.Hour,
	}
	// luaLatencyBounds bound one check's round trip to the control Redis
	// (a script, or a pipeline of them): well under a millisecond on a
	// near Redis, up to Config.Timeout (100ms by default) when it is slow.
	luaLatencyBounds = [...]time.Duration{
		100 * time.Microsecond, 250 * time.Microsecond, 500 * time.Microsecond, time.Millisecond,
		2500 * time.Microsecond, 5 * time.Millisecond, 10 * time.Millisecond, 25 * time.Millisecond,
		50 * time.Millisecond, 100 * time.Millisecond, 250 * time.Millisecond, 500 * time.Millisecond, time.Second,
	}
)

// RuleStats are the counters of one rule at one endpoint.
type RuleStats struct {
	Endpoint string // EndpointConnect, an API endpoint, or EndpointOther
	Rule     string // Rule*
	Allowed  int64  // checks of the rule passed
	Rejected int64  // checks the rule refused
	// RetryAfter is the wait each refusal asked for (Decision.RetryAfter).
	RetryAfter histogram.Snapshot
	// LuaLatency is the time of each round trip to the control Redis that
	// ran the rule's script, answered or failed; a round trip that checked
	// two rules (the connect buckets, the two caps) counts under each.
	LuaLatency histogram.Snapshot
}

// ruleCounters are one rule's live RuleStats at one endpoint.
type ruleCounters struct {
	allowed, rejected      atomic.Int64
	retryAfter, luaLatency *histogram.Histogram
}

type ruleKey struct{ endpoint, rule string }

// endpointStats holds the rule counters by endpoint and rule, each made
// when the rule is first checked there: an endpoint has the series of the
// rules that apply to it, no more.
type endpointStats struct {
	mu        sync.RWMutex // guards m and endpoints
	m         map[ruleKey]*ruleCounters
	endpoints map[string]struct{}
}

func (e *endpointStats) init() {
	e.m = make(map[ruleKey]*ruleCounters)
	e.endpoints = make(map[string]struct{})
}

// rule returns the counters of rule at endpoint.
func (e *endpointStats) rule(endpoint, rule string) *ruleCounters {
	k := ruleKey{endpoint, rule}
	e.mu.RLock()
	r, ok := e.m[k]
	e.mu.RUnlock()
	if ok {
		return r
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if _, known := e.endpoints[endpoint]; !known {
		if len(e.endpoints) >= maxEndpoints {
			k.endpoint = EndpointOther
		} else {
			e.endpoints[endpoint] = struct{}{}
		}
	}
	if r, ok = e.m[k]; !ok {
		r = &ruleCounters{retryAfter: histogram.New(retryAfterBounds[:]...), luaLatency: histogram.New(luaLatencyBounds[:]...)}
		e.m[k] = r
	}
	return r
}

// stats reads the counters of every rule checked so far, by endpoint.
func (e *endpointStats) stats() []RuleStats {
	e.mu.RLock()
	defer e.mu.RUnlock()
	out := make([]RuleStats, 0, len(e.m))
	for k, r := range e.m {
		out = append(out, RuleStats{
			Endpoint: k.endpoint, Rule: k.rule,
			Allowed: r.allowed.Load(), Rejected: r.rejected.Load(),
			RetryAfter: r.retryAfter.Snapshot(), LuaLatency: r.luaLatency.Snapshot(),
		})
	}
	return out
}

// Passed counts a pass of a limit its caller checked itself (RuleConnsPerIP,
// RuleAuthFailures) at endpoint. A nil Controller counts nothing.
func (c *Controller) Passed(endpoint, rule string) {
	if c != nil {
		c.allow(endpoint, rule)
	}
}

// Refused counts a refusal by a limit its caller checked itself, with the
// wait it asked for. A nil Controller counts nothing.
func (c *Controller) Refused(endpoint, rule string, retryAfter time.Duration) {
	if c != nil {
		c.count(endpoint, Decision{Rule: rule, RetryAfter: retryAfter})
	}
}

// luaDone records the latency of a round trip that ran the scripts of
// rules at endpoint, started at start.
func (c *Controller) luaDone(endpoint string, start time.Time, rules ...string) {
	d := time.Since(start)
	for _, r := range rules {
		c.stats.byEndpoint.rule(endpoint, r).luaLatency.Observe(d)
	}
}
