package admission

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
	"golang.org/x/sync/singleflight"
)

// API checks one call of tenant to endpoint (a short stable name, such as
// "task") against the tenant's plan. claimPlan is the plan the caller's
// token names; empty means the tenant's configured plan (see Plan).
func (c *Controller) API(ctx context.Context, tenant, claimPlan, endpoint string) Decision {
	if len(c.cfg.Plans) == 0 {
		return Decision{Allowed: true}
	}
	limit := c.limitFor(c.Plan(ctx, tenant, claimPlan))
	if limit <= 0 {
		return Decision{Allowed: true}
	}
	window := c.cfg.APIWindow
	if c.useRedis() {
		tctx, cancel := context.WithTimeout(ctx, c.cfg.Timeout)
		start := time.Now()
		cmd := windowScript.Run(tctx, c.rdb, []string{c.names.api(tenant, endpoint)}, limit, window.Milliseconds(), newLeaseID())
		c.luaDone(endpoint, start, RuleAPI)
		v, err := ints(cmd, 2)
		cancel()
		if err == nil {
			if v[0] == 1 {
				c.allow(endpoint, RuleAPI)
				return Decision{Allowed: true}
			}
			return c.count(endpoint, Decision{Rule: RuleAPI, RetryAfter: ms(v[1])})
		}
		c.failedFor(ctx, "api window", err)
	}
	// The node's share of the window, as a bucket that refills evenly.
	share := c.localShare(limit)
	perSecond := float64(share) / window.Seconds()
	if wait, ok := c.local.take(localBucket("api", tenant, endpoint), perSecond, share, time.Now()); !ok {
		return c.count(endpoint, Decision{Rule: RuleAPI, RetryAfter: wait, Local: true})
	}
	c.allow(endpoint, RuleAPI)
	return c.count(endpoint, Decision{Allowed: true, Local: true})
}

// Poll reports whether one fallback poll of tenant/user, a snapshot read
// of a client that cannot hold a stream, passes the user's poll bucket,
// and so costs the tenant's API window nothing: a page that polls at its
// client's pace is a stream that could not connect, not a use of the API.
// A poll past the bucket is the caller's to check with API, like any
// call; so a client that marks every call a poll gains its bucket, no
// more. The bucket lives in the control Redis, or locally while it does
// not answer.
func (c *Controller) Poll(ctx context.Context, tenant, user string) bool {
	free := c.pollBucket(ctx, tenant, user)
	if free {
		c.stats.pollsFree.Add(1)
	} else {
		c.stats.pollsCharged.Add(1)
	}
	return free
}

func (c *Controller) pollBucket(ctx context.Context, tenant, user string) bool {
	if c.cfg.PollUserBurst <= 0 || c.cfg.PollUserRate <= 0 {
		return false
	}
	if c.useRedis() {
		tctx, cancel := context.WithTimeout(ctx, c.cfg.Timeout)
		cmd := bucketScript.Run(tctx, c.rdb, []string{c.names.pollUser(tenant, user)}, c.cfg.PollUserBurst, c.cfg.PollUserRate)
		v, err := ints(cmd, 2)
		cancel()
		if err == nil {
			c.recovered()
			return v[0] == 1
		}
		c.failedFor(ctx, "poll bucket", err)
	}
	_, ok := c.local.take(localBucket("poll", tenant, user), c.cfg.PollUserRate, c.cfg.PollUserBurst, time.Now())
	return ok
}

func (c *Controller) limitFor(plan string) int {
	if l, ok := c.cfg.Plans[plan]; ok {
		return l
	}
	return c.cfg.Plans[c.cfg.DefaultPlan]
}

// Plan is tenant's plan: claimPlan when it names a known plan, else the
// plan field of the tenant's configuration hash (tenant:<tenant> in the
// control Redis, cached for PlanCacheTTL), else DefaultPlan.
func (c *Controller) Plan(ctx context.Context, tenant, claimPlan string) string {
	if _, ok := c.cfg.Plans[claimPlan]; ok {
		return claimPlan
	}
	if c.rdb == nil {
		return c.cfg.DefaultPlan
	}
	now := time.Now()
	if p, ok := c.plans.get(tenant, now); ok {
		return p
	}
	// One lookup per tenant at a time; callers that wait share it.
	v, _, _ := c.plans.sf.Do(tenant, func() (any, error) {
		if !c.useRedis() {
			return c.cfg.DefaultPlan, nil
		}
		tctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.cfg.Timeout)
		defer cancel()
		p, err := c.rdb.HGet(tctx, c.names.tenantConfig(tenant), "plan").Result()
		ttl := c.cfg.PlanCacheTTL
		switch {
		case errors.Is(err, redis.Nil):
			p = c.cfg.DefaultPlan
		case err != nil:
			c.failedFor(ctx, "tenant plan", err)
			// Not cached for long: the real plan is read once Redis is back.
			p, ttl = c.cfg.DefaultPlan, c.cfg.RetryAfterFailure
		}
		if _, ok := c.cfg.Plans[p]; !ok {
			p = c.cfg.DefaultPlan
		}
		c.plans.put(tenant, p, time.Now().Add(ttl))
		return p, nil
	})
	return v.(string)
}

// planCache holds tenants' configured plans.
type planCache struct {
	sf singleflight.Group
	mu sync.Mutex // guards m
	m  map[string]planEntry
}

type planEntry struct {
	plan    string
	expires time.Time
}

func (p *planCache) init() { p.m = make(map[string]planEntry) }

func (p *planCache) get(tenant string, now time.Time) (string, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	e, ok := p.m[tenant]
	if !ok || now.After(e.expires) {
		return "", false
	}
	return e.plan, true
}

func (p *planCache) put(tenant, plan string, expires time.Time) {
	p.mu.Lock()
	p.m[tenant] = planEntry{plan, expires}
	p.mu.Unlock()
}

func (p *planCache) sweep(now time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for t, e := range p.m {
		if now.After(e.expires) {
			delete(p.m, t)
		}
	}
}
