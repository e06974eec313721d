package admission

import (
	"context"
	"flag"
	"log/slog"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pushd/pushd/internal/episode"
	"github.com/pushd/pushd/internal/flagval"
)

// Plans.
const (
	PlanFree       = "free"
	PlanPro        = "pro"
	PlanEnterprise = "enterprise"
)

// DefaultPlans returns the production API limits per plan, in requests
// per tenant and endpoint per window (a minute by default). The map is the
// caller's.
func DefaultPlans() map[string]int {
	return map[string]int{PlanFree: 60, PlanPro: 600, PlanEnterprise: 6000}
}

// Config configures a Controller. New(Config{}) works: local only, and no
// limit at all, since each limit's zero value means none; DefaultConfig
// holds the production limits.
type Config struct {
	// Redis is the control store the limits, leases and tenant plans live
	// in. Nil means local limits only (the embedded mode). A client made
	// with ContextTimeoutEnabled honours Timeout on the socket.
	Redis redis.UniversalClient
	// Prefix is prepended to every key (keys.Names.Prefix).
	Prefix string

	// ConnectUserBurst and ConnectUserRate are the connect token bucket of
	// each user: capacity and refill per second. Either zero means no
	// bucket.
	ConnectUserBurst int
	ConnectUserRate  float64
	// ConnectIPBurst and ConnectIPRate are the connect bucket of each client
	// IP. Either zero means no bucket.
	ConnectIPBurst int
	ConnectIPRate  float64

	// PollUserBurst and PollUserRate are each user's bucket of fallback
	// polls (Poll): the snapshot reads of a client that cannot hold a
	// stream, which pass it without costing the tenant's API window. Either
	// zero means no such bucket: every poll is an API call.
	PollUserBurst int
	PollUserRate  float64

	// Plans are the API limits per plan, requests per tenant and endpoint
	// per APIWindow (DefaultPlans are the production ones). Nil means no API
	// limits; a plan whose limit is zero or less is unlimited. DefaultPlan is
	// the plan of a tenant neither its token nor its configuration names;
	// empty means PlanFree.
	Plans       map[string]int
	DefaultPlan string
	// APIWindow is the sliding window of the API limits; zero means 1m.
	APIWindow time.Duration
	// PlanCacheTTL is how long a tenant's configured plan is kept in process;
	// zero means 1m.
	PlanCacheTTL time.Duration

	// MaxConnsPerUser and MaxConnsPerTenant cap open connections across the
	// fleet. Zero means no cap; with neither cap, no leases are taken.
	MaxConnsPerUser   int
	MaxConnsPerTenant int
	// LeaseTTL is how long a connection's lease outlives its node's last
	// renewal; zero means 30s. RenewInterval is how often a node renews its
	// leases (one pipelined round trip); zero means LeaseTTL/3.
	LeaseTTL      time.Duration
	RenewInterval time.Duration
	// ReconcileInterval is how often the counts are rebuilt from the live
	// leases; zero means 1m.
	ReconcileInterval time.Duration

	// ExpectedNodes divides the fleet caps and the API limits into the
	// node's local share while Redis is down; zero means 1 (each node allows
	// the whole cap: an outage admits too much rather than too little).
	ExpectedNodes int
	// Timeout bounds each admission round trip to Redis; past it the node
	// decides locally. Zero means 100ms.
	Timeout time.Duration
	// RetryAfterFailure is how long the node stays on local limits after
	// Redis failed before it tries Redis again; zero means 1s.
	RetryAfterFailure time.Duration

	// Sessions, when set, re-validates the sessions of open connections
	// every SessionCheckInterval (zero means 10s); a session found gone ends
	// its connections as with an expired token.
	Sessions             Sessions
	SessionCheckInterval time.Duration

	Logger *slog.Logger // nil means slog.Default()
}

// RegisterFlags defines on fs a flag for each setting of c an operator
// sets, bound to its field, with the field's value as its default: call it
// on a Config with its defaults (DefaultConfig or WithDefaults).
func (c *Config) RegisterFlags(fs *flag.FlagSet) {
	fs.IntVar(&c.ConnectUserBurst, "connect-user-burst", c.ConnectUserBurst, "connects a user may make at once (token bucket capacity); 0 means no limit")
	fs.Float64Var(&c.ConnectUserRate, "connect-user-rate", c.ConnectUserRate, "connects per second a user's bucket refills")
	fs.IntVar(&c.ConnectIPBurst, "connect-ip-burst", c.ConnectIPBurst, "connects a client IP may make at once; 0 means no limit")
	fs.Float64Var(&c.ConnectIPRate, "connect-ip-rate", c.ConnectIPRate, "connects per second a client IP's bucket refills")
	fs.IntVar(&c.MaxConnsPerUser, "max-conns-per-user", c.MaxConnsPerUser, "open connections a user may hold across the fleet; 0 means no cap")
	fs.IntVar(&c.MaxConnsPerTenant, "max-conns-per-tenant", c.MaxConnsPerTenant, "open connections a tenant may hold across the fleet; 0 means no cap")
	fs.IntVar(&c.PollUserBurst, "poll-user-burst", c.PollUserBurst, "fallback polls (snapshot reads marked X-Pushd-Poll, which the JavaScript client sends when it cannot stream) a user may make at once without costing the tenant's API window; past them a poll is an API call like any other; 0 means every poll is one")
	fs.Float64Var(&c.PollUserRate, "poll-user-rate", c.PollUserRate, "fallback polls per second a user's bucket refills")
	flagval.MapInt(fs, c.Plans, PlanFree, "api-limit-free", "snapshot API calls per tenant and endpoint per --api-window on the free plan; 0 means no limit")
	flagval.MapInt(fs, c.Plans, PlanPro, "api-limit-pro", "the same on the pro plan")
	flagval.MapInt(fs, c.Plans, PlanEnterprise, "api-limit-enterprise", "the same on the enterprise plan")
	fs.StringVar(&c.DefaultPlan, "default-plan", c.DefaultPlan, "plan of a tenant that neither its token (plan claim) nor its configuration (tenant:<id> hash, field plan) names")
	flagval.Duration(fs, &c.APIWindow, "api-window", "sliding window of the API limits")
	flagval.Duration(fs, &c.PlanCacheTTL, "plan-cache-ttl", "how long a tenant's configured plan is cached in process")
	flagval.Duration(fs, &c.LeaseTTL, "lease-ttl", "how long a connection's lease outlives its node's last renewal")
	flagval.Duration(fs, &c.RenewInterval, "lease-renew-interval", "how often a node renews its connections' leases (one pipelined round trip)")
	flagval.Duration(fs, &c.ReconcileInterval, "lease-reconcile-interval", "how often connection counts are rebuilt from live leases")
	fs.IntVar(&c.ExpectedNodes, "expected-nodes", c.ExpectedNodes, "nodes in the fleet: while the control Redis is down each node allows this share of the caps and API limits")
	flagval.Duration(fs, &c.Timeout, "admission-timeout", "longest wait for the control Redis per admission check before local limits decide")
	flagval.Duration(fs, &c.RetryAfterFailure, "admission-retry", "after the control Redis failed, how long local limits decide before Redis is tried again")
	flagval.Duration(fs, &c.SessionCheckInterval, "session-check-interval", "how often the sessions of open connections are re-validated")
}

// DefaultConfig is the limits a node runs with unless told otherwise.
func DefaultConfig() Config {
	c := Config{
		ConnectUserBurst: 20, ConnectUserRate: 1,
		ConnectIPBurst: 200, ConnectIPRate: 20,
		MaxConnsPerUser: 50, MaxConnsPerTenant: 10000,
		PollUserBurst: 5, PollUserRate: 1,
		Plans: DefaultPlans(),
	}
	return c.WithDefaults()
}

// WithDefaults returns c with each zero setting that has a default set to
// it; it is the one place those defaults are written.
func (c Config) WithDefaults() Config {
	defd := func(v *time.Duration, d time.Duration) {
		if *v <= 0 {
			*v = d
		}
	}
	if c.DefaultPlan == "" {
		c.DefaultPlan = PlanFree
	}
	defd(&c.APIWindow, time.Minute)
	defd(&c.PlanCacheTTL, time.Minute)
	defd(&c.LeaseTTL, 30*time.Second)
	defd(&c.RenewInterval, c.LeaseTTL/3)
	defd(&c.ReconcileInterval, time.Minute)
	if c.ExpectedNodes <= 0 {
		c.ExpectedNodes = 1
	}
	defd(&c.Timeout, 100*time.Millisecond)
	defd(&c.RetryAfterFailure, time.Second)
	defd(&c.SessionCheckInterval, 10*time.Second)
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

// Rules a decision names, in metrics and logs.
const (
	RuleConnectUser = "connect_user" // the user's connect bucket
	RuleConnectIP   = "connect_ip"   // the client IP's connect bucket
	RuleAPI         = "api"          // the tenant's API window
	RuleUserCap     = "user_cap"     // the user's open connections
	RuleTenantCap   = "tenant_cap"   // the tenant's open connections
	// Limits of a node alone, which their callers check and report with
	// Passed and Refused, so every refusal is in one set of counters.
	RuleConnsPerIP   = "conns_per_ip"  // open connections of a client address on this node
	RuleAuthFailures = "auth_failures" // failed authentications of a client address
)

// rules lists every rule, for Stats' sums by rule.
var rules = [...]string{RuleConnectUser, RuleConnectIP, RuleAPI, RuleUserCap, RuleTenantCap, RuleConnsPerIP, RuleAuthFailures}

// Decision is the answer to one admission check.
type Decision struct {
	Allowed bool
	// Rule names the rule that refused; empty when allowed.
	Rule string
	// RetryAfter is when a refused rate limit lets the caller in again;
	// zero for a connection cap, which frees up when a connection closes.
	RetryAfter time.Duration
	// Local means local limits decided, because Redis did not answer.
	Local bool
}

// counters are what Stats reads.
type counters struct {
	byEndpoint                                                   endpointStats
	fallbacks, storeErrors                                       atomic.Int64
	leasesAcquired, leasesReleased, leasesExpired, leasesReadded atomic.Int64
	reconciles, reconcileDiff, sessionsClosed, sessionChecks     atomic.Int64
	pollsFree, pollsCharged                                      atomic.Int64
}

// Stats are a Controller's counters since it started and its gauges now.
type Stats struct {
	StoreUp bool // admission uses Redis now, not local limits
	Leases  int  // connection leases the node holds

	Allowed  map[string]int64 // checks passed, by rule (Rule*): the sums of Rules
	Rejected map[string]int64 // checks refused, by rule (Rule*)
	// Rules are the counters by endpoint and rule, of the rules checked so
	// far; a rule that is off (a zero limit) is never checked.
	Rules []RuleStats
	// Fallbacks are checks decided on local limits because Redis failed or
	// had failed within RetryAfterFailure; StoreErrors are the failed
	// round trips themselves (checks, renewals, releases, reconciles).
	Fallbacks   int64
	StoreErrors int64

	LeasesAcquired int64
	LeasesReleased int64 // released in Redis by a closing connection
	LeasesExpired  int64 // purged after their node stopped renewing them
	LeasesReadded  int64 // renewals that found a lease missing and wrote it again
	Reconciles     int64 // tenants reconciled
	ReconcileDiff  int64 // sum of |count - live leases| the reconciles repaired
	SessionsClosed int64 // sessions found deleted or expired on re-validation
	SessionChecks  int64 // re-validations of every open session that ran to their end

	// Fallback polls (Poll): PollsFree passed their user's poll bucket and
	// cost the tenant's API window nothing; PollsCharged did not, and are
	// the caller's to check against the window like any call.
	PollsFree, PollsCharged int64
}

// Controller makes admission decisions. It is safe for concurrent use;
// Close stops its goroutine.
type Controller struct {
	cfg  Config
	log  *slog.Logger
	lost *episode.Logger // failed round trips to Redis, until one succeeds
	// sessionsLost: failed re-validations of sessions, until one succeeds.
	sessionsLost *episode.Logger
	rdb          redis.UniversalClient // nil: local only
	names        names

	// downUntil is the Unix ns until which Redis is skipped after a failure.
	downUntil atomic.Int64
	local     local
	plans     planCache
	leases    leaseSet
	sessions  sessionSet

	stats counters

	wake      chan struct{} // cap 1: releases are queued
	done      chan struct{}
	wg        sync.WaitGroup
	closeOnce sync.Once
}

// New starts a Controller. Its goroutine renews leases, releases closed
// connections' leases, reconciles counts and forgets idle local limits.
func New(cfg Config) *Controller {
	cfg = cfg.WithDefaults()
	c := &Controller{
		cfg: cfg, log: cfg.Logger, rdb: cfg.Redis, names: names{prefix: cfg.Prefix},
		lost:         episode.New(cfg.Logger, "admission store still failing; using local limits"),
		sessionsLost: episode.New(cfg.Logger, "session re-validation still failing; sessions kept until it answers"),
		wake:         make(chan struct{}, 1), done: make(chan struct{}),
	}
	c.local.init()
	c.stats.byEndpoint.init()
	c.plans.init()
	c.leases.init()
	c.sessions.init()
	c.wg.Add(1)
	go c.loop()
	return c
}

// Close stops the Controller's goroutine after releasing in Redis the
// leases of connections that closed. The leases of connections still open
// are left to expire: Close is for a node going away, after its hub. It is
// idempotent.
func (c *Controller) Close() {
	c.closeOnce.Do(func() {
		close(c.done)
		c.wg.Wait()
	})
}

// Stats reads the Controller's counters and gauges. Each is read
// atomically, not all of them at one instant.
func (c *Controller) Stats() Stats {
	s := Stats{
		StoreUp:        c.StoreUp(),
		Leases:         c.Leases(),
		Allowed:        make(map[string]int64, len(rules)),
		Rejected:       make(map[string]int64, len(rules)),
		Fallbacks:      c.stats.fallbacks.Load(),
		StoreErrors:    c.stats.storeErrors.Load(),
		LeasesAcquired: c.stats.leasesAcquired.Load(),
		LeasesReleased: c.stats.leasesReleased.Load(),
		LeasesExpired:  c.stats.leasesExpired.Load(),
		LeasesReadded:  c.stats.leasesReadded.Load(),
		Reconciles:     c.stats.reconciles.Load(),
		ReconcileDiff:  c.stats.reconcileDiff.Load(),
		SessionsClosed: c.stats.sessionsClosed.Load(), SessionChecks: c.stats.sessionChecks.Load(),
		PollsFree: c.stats.pollsFree.Load(), PollsCharged: c.stats.pollsCharged.Load(),
		Rules: c.stats.byEndpoint.stats(),
	}
	for _, r := range rules {
		s.Allowed[r], s.Rejected[r] = 0, 0
	}
	for _, r := range s.Rules {
		s.Allowed[r.Rule] += r.Allowed
		s.Rejected[r.Rule] += r.Rejected
	}
	return s
}

// StoreUp reports whether the node currently uses Redis for its limits.
func (c *Controller) StoreUp() bool { return c.useRedis() }

func (c *Controller) useRedis() bool {
	return c.rdb != nil && time.Now().UnixNano() >= c.downUntil.Load()
}

// failedFor is failed for a check a caller asked for. A caller that gave
// up first (its client went away, the request ended) learned nothing of
// the store: the others' checks keep asking it.
func (c *Controller) failedFor(ctx context.Context, what string, err error) {
	if ctx.Err() != nil {
		return
	}
	c.failed(what, err)
}

// failed records a failed round trip and moves the node to local limits
// for RetryAfterFailure. Redis is tried again after each such pause, so a
// lost Redis fails every RetryAfterFailure: the episode logs it once, then
// in summaries.
func (c *Controller) failed(what string, err error) {
	c.stats.storeErrors.Add(1)
	c.downUntil.Store(time.Now().Add(c.cfg.RetryAfterFailure).UnixNano())
	c.lost.Fail("admission store failed; using local limits", err, "op", what, "retry_after", c.cfg.RetryAfterFailure)
}

// count counts a decision at endpoint: a fallback to local limits, and a
// refusal with the wait it asked for. Passes are counted by allow, rule by
// rule.
func (c *Controller) count(endpoint string, d Decision) Decision {
	if d.Local && c.rdb != nil {
		c.stats.fallbacks.Add(1)
	}
	if d.Allowed {
		return d
	}
	r := c.stats.byEndpoint.rule(endpoint, d.Rule)
	r.rejected.Add(1)
	r.retryAfter.Observe(d.RetryAfter)
	return d
}

// allow counts a pass of each of rules at endpoint.
func (c *Controller) allow(endpoint string, rules ...string) {
	for _, r := range rules {
		c.stats.byEndpoint.rule(endpoint, r).allowed.Add(1)
	}
}

func ms(v int64) time.Duration { return time.Duration(v) * time.Millisecond }

// localShare is a node's share of a fleet-wide limit while Redis is down.
func (c *Controller) localShare(limit int) int {
	if limit <= 0 {
		return limit
	}
	return max(1, int(math.Ceil(float64(limit)/float64(c.cfg.ExpectedNodes))))
}

func capArg(v int) int {
	if v < 0 {
		return 0
	}
	return v
}

// Connect checks a new connection of tenant/user from ip against the
// connect buckets and the connection caps. When it is admitted, the
// returned Hold is the connection's lease (and session, when sess is not
// empty): put it in hub.Principal.Hold, and Release it yourself if the
// hub never attaches it. sess is an opaque session token the connection
// authenticated with; empty for a JWT.
func (c *Controller) Connect(ctx context.Context, tenant, user, ip, sess string) (*Hold, Decision) {
	if d := c.connectBuckets(ctx, tenant, user, ip); !d.Allowed {
		return nil, c.count(EndpointConnect, d)
	}
	h, d := c.acquire(ctx, tenant, user)
	if h != nil && sess != "" {
		h.session.Store(c.sessions.add(sess))
	}
	return h, c.count(EndpointConnect, d)
}

// connectBuckets takes a token from the IP's bucket and the user's in one
// round trip.
func (c *Controller) connectBuckets(ctx context.Context, tenant, user, ip string) Decision {
	ipOn := c.cfg.ConnectIPBurst > 0 && c.cfg.ConnectIPRate > 0 && ip != ""
	userOn := c.cfg.ConnectUserBurst > 0 && c.cfg.ConnectUserRate > 0
	if !ipOn && !userOn {
		return Decision{Allowed: true}
	}
	var on []string // the rules checked, for the counters
	if ipOn {
		on = append(on, RuleConnectIP)
	}
	if userOn {
		on = append(on, RuleConnectUser)
	}
	if c.useRedis() {
		var calls []*scriptCall
		var ipCall, userCall *scriptCall
		if ipOn {
			ipCall = &scriptCall{script: bucketScript, keys: []string{c.names.connIP(ip)}, args: []any{c.cfg.ConnectIPBurst, c.cfg.ConnectIPRate}}
			calls = append(calls, ipCall)
		}
		if userOn {
			userCall = &scriptCall{script: bucketScript, keys: []string{c.names.connUser(tenant, user)}, args: []any{c.cfg.ConnectUserBurst, c.cfg.ConnectUserRate}}
			calls = append(calls, userCall)
		}
		tctx, cancel := context.WithTimeout(ctx, c.cfg.Timeout)
		start := time.Now()
		err := runPipelined(tctx, c.rdb, calls)
		c.luaDone(EndpointConnect, start, on...)
		cancel()
		d, err := bucketDecision(err, ipCall, userCall)
		if err == nil {
			c.recovered()
			// Both buckets were checked in one round trip: each one that
			// gave a token passed, whichever refused.
			c.allow(EndpointConnect, bucketPasses(ipCall, userCall)...)
			return d
		}
		c.failedFor(ctx, "connect bucket", err)
	}
	now := time.Now()
	d := Decision{Allowed: true, Local: true}
	if ipOn {
		if wait, ok := c.local.take(localBucket("ip", ip), c.cfg.ConnectIPRate, c.cfg.ConnectIPBurst, now); !ok {
			return Decision{Rule: RuleConnectIP, RetryAfter: wait, Local: true}
		}
	}
	if userOn {
		if wait, ok := c.local.take(localBucket("u", tenant, user), c.cfg.ConnectUserRate, c.cfg.ConnectUserBurst, now); !ok {
			if ipOn {
				c.allow(EndpointConnect, RuleConnectIP)
			}
			return Decision{Rule: RuleConnectUser, RetryAfter: wait, Local: true}
		}
	}
	c.allow(EndpointConnect, on...)
	return d
}

// ruleCall is a bucket's script call with the rule it checks.
type ruleCall struct {
	c    *scriptCall
	rule string
}

// bucketCalls are the IP and user bucket calls of one connect, in the
// order a refusal is reported.
func bucketCalls(ipCall, userCall *scriptCall) []ruleCall {
	return []ruleCall{{ipCall, RuleConnectIP}, {userCall, RuleConnectUser}}
}

// bucketPasses names the buckets of a decided round trip that gave a token.
func bucketPasses(ipCall, userCall *scriptCall) []string {
	var out []string
	for _, call := range bucketCalls(ipCall, userCall) {
		if call.c == nil {
			continue
		}
		if v, err := ints(call.c.cmd, 2); err == nil && v[0] == 1 {
			out = append(out, call.rule)
		}
	}
	return out
}

func bucketDecision(err error, ipCall, userCall *scriptCall) (Decision, error) {
	if err != nil {
		return Decision{}, err
	}
	for _, call := range bucketCalls(ipCall, userCall) {
		if call.c == nil {
			continue
		}
		v, err := ints(call.c.cmd, 2)
		if err != nil {
			return Decision{}, err
		}
		if v[0] != 1 {
			return Decision{Rule: call.rule, RetryAfter: ms(v[1])}, nil
		}
	}
	return Decision{Allowed: true}, nil
}
