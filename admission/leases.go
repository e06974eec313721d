package admission

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	mathrand "math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// capRetryAfter is the Retry-After hint of a connection refused by a cap:
// a slot frees when another connection closes, which no bucket predicts.
const capRetryAfter = 5 * time.Second

// batchSize bounds the leases one script call renews or releases, so no
// single script holds Redis for long.
const batchSize = 500

// maxKeptReleases bounds the releases a node keeps for Redis while it is
// taken for down.
const maxKeptReleases = 100 * batchSize

// Hold is what an admitted connection holds: its lease on the fleet's
// connection caps and, for a session token, its session. It implements
// hub.Hold: the hub attaches it when it registers the connection, releases
// it when the connection closes, and ends the connection as with an
// expired token once Revoked reports true (the session is gone).
type Hold struct {
	c            *Controller
	tenant, user string
	member       string // lease member, <16 hex>:<user>; empty when no cap is on

	// session is the session the connection's credential is now, re-checked
	// while it is held; nil for a JWT. Revoked loads it on the hub's tick;
	// mu orders Rebind and Release, which swap it.
	mu      sync.Mutex
	session atomic.Pointer[sessionEntry]

	attached atomic.Bool
	released atomic.Bool
}

// Attach records that the hub registered the connection.
func (h *Hold) Attach() { h.attached.Store(true) }

// Attached reports whether the hub registered the connection: a Hold the
// transport never handed to the hub is its caller's to Release.
func (h *Hold) Attached() bool { return h.attached.Load() }

// Revoked reports whether the connection's session was deleted or expired.
func (h *Hold) Revoked() bool {
	e := h.session.Load()
	return e != nil && e.revoked.Load()
}

// Rebind makes the session this connection answers to the one its
// credential is now (a WebSocket refresh): a session token is re-checked
// from now on, the one it replaces no longer is, and an empty session (a
// JWT) is re-checked by nothing but its expiry. A Hold released is not
// bound again.
func (h *Hold) Rebind(session string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.released.Load() {
		return
	}
	var e *sessionEntry
	if session != "" {
		e = h.c.sessions.add(session)
	}
	if old := h.session.Swap(e); old != nil {
		h.c.sessions.remove(old)
	}
}

// Release gives the connection's slot back: at once on this node, and in
// Redis from the Controller's goroutine (so it never blocks the hub). It
// is idempotent.
func (h *Hold) Release() {
	if h.released.Swap(true) {
		return
	}
	c := h.c
	c.local.close(h.tenant, h.user)
	h.mu.Lock()
	if e := h.session.Swap(nil); e != nil {
		c.sessions.remove(e)
	}
	h.mu.Unlock()
	if h.member == "" {
		return
	}
	c.leases.remove(h)
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// leaseSet is the node's live leases, by tenant, and the releases and
// purges waiting for the Controller's goroutine.
type leaseSet struct {
	mu       sync.Mutex // guards the fields below
	byTenant map[string]map[*Hold]struct{}
	released []*Hold
	// doubtful are holds refused on local limits after their acquire
	// failed in flight: Redis may have run it anyway, leaving a lease no
	// renewal keeps and a count it holds until it expires. They are
	// released a renewal or two later (doubtful, then doubtfulOld), once
	// the acquire has surely run or never will: released at once, the
	// release could reach Redis before the acquire.
	doubtful, doubtfulOld []*Hold
	// expired are other nodes' leases an acquire found expired, by member,
	// to purge in Redis (an acquire purges only its own user's).
	expired map[string]deadLease
	// seen are the users per tenant, by the tenant's registry bucket, that
	// held a lease here since the reconcile of that bucket: their counts are
	// checked even when no lease is left.
	seen [tenantBuckets]map[string]map[string]struct{}
}

func (s *leaseSet) init() {
	s.byTenant = make(map[string]map[*Hold]struct{})
	s.expired = make(map[string]deadLease)
}

// takeSeen returns the users seen in bucket b's tenants, and forgets them.
func (s *leaseSet) takeSeen(b int) map[string]map[string]struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	seen := s.seen[b]
	s.seen[b] = nil
	return seen
}

// putSeen gives back what takeSeen returned, for a reconcile that failed.
func (s *leaseSet) putSeen(b int, seen map[string]map[string]struct{}) {
	if len(seen) == 0 {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.seen[b] == nil {
		s.seen[b] = seen
		return
	}
	for t, users := range seen {
		u := s.seen[b][t]
		if u == nil {
			s.seen[b][t] = users
			continue
		}
		maps.Copy(u, users)
	}
}

// deadLease is an expired lease of another user that an acquire left in
// Redis.
type deadLease struct{ tenant, member string }

func (s *leaseSet) add(h *Hold) {
	s.mu.Lock()
	defer s.mu.Unlock()
	m := s.byTenant[h.tenant]
	if m == nil {
		m = make(map[*Hold]struct{})
		s.byTenant[h.tenant] = m
	}
	m[h] = struct{}{}
	b := tenantBucket(h.tenant)
	if s.seen[b] == nil {
		s.seen[b] = make(map[string]map[string]struct{})
	}
	u := s.seen[b][h.tenant]
	if u == nil {
		u = make(map[string]struct{})
		s.seen[b][h.tenant] = u
	}
	u[h.user] = struct{}{}
}

func (s *leaseSet) remove(h *Hold) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if m := s.byTenant[h.tenant]; m != nil {
		delete(m, h)
		if len(m) == 0 {
			delete(s.byTenant, h.tenant)
		}
	}
	s.released = append(s.released, h)
}

// Leases is the number of leases the node holds.
func (c *Controller) Leases() int {
	c.leases.mu.Lock()
	defer c.leases.mu.Unlock()
	n := 0
	for _, m := range c.leases.byTenant {
		n += len(m)
	}
	return n
}

func newLeaseID() string {
	var b [8]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

func (c *Controller) capKeys(tenant, user string) []string {
	return []string{c.names.capUser(tenant, user), c.names.capTenant(tenant), c.names.leases(tenant)}
}

// keyTTL is the TTL of a tenant's leases and count: past it, with no node
// renewing, every lease they hold has expired too.
func (c *Controller) keyTTL() int64 { return (2 * c.cfg.LeaseTTL).Milliseconds() }

// userKeyTTL is the TTL of a user's count. Renewals leave the users' counts
// alone, a command per user each RenewInterval that made the fleet's Redis
// upkeep grow with its connections; the reconcile refreshes the count of
// every user with a lease, once per ReconcileInterval, and this outlasts
// two of its rounds missed. A count whose leases are all gone (their nodes
// too) is set right by the next reconcile, which reads the expired leases.
func (c *Controller) userKeyTTL() int64 {
	return (2*c.cfg.LeaseTTL + 3*c.cfg.ReconcileInterval).Milliseconds()
}

// acquire takes a slot under the caps: in Redis, one script for both
// counts and the lease; while Redis is down, under the node's share.
func (c *Controller) acquire(ctx context.Context, tenant, user string) (*Hold, Decision) {
	h := &Hold{c: c, tenant: tenant, user: user}
	userCap, tenantCap := c.cfg.MaxConnsPerUser, c.cfg.MaxConnsPerTenant
	if userCap <= 0 && tenantCap <= 0 {
		c.local.open(tenant, user, 0, 0, true)
		return h, Decision{Allowed: true}
	}
	h.member = leaseMember(newLeaseID(), user)
	var on []string // the caps checked, for the counters
	if userCap > 0 {
		on = append(on, RuleUserCap)
	}
	if tenantCap > 0 {
		on = append(on, RuleTenantCap)
	}
	doubtful := false // the acquire failed in flight: Redis may have run it
	if c.useRedis() {
		tctx, cancel := context.WithTimeout(ctx, c.cfg.Timeout)
		start := time.Now()
		cmd := acquireScript.Run(tctx, c.rdb, c.capKeys(tenant, user),
			h.member, c.cfg.LeaseTTL.Milliseconds(), capArg(userCap), capArg(tenantCap), c.names.capUserPrefix(tenant), c.keyTTL(), c.userKeyTTL())
		c.luaDone(EndpointConnect, start, on...)
		v, dead, err := acquireReply(cmd)
		cancel()
		if err == nil {
			c.stats.leasesExpired.Add(v[2])
			c.purgeLater(tenant, dead)
			switch {
			case v[0] == 1:
				c.local.open(tenant, user, 0, 0, true)
				c.leases.add(h)
				c.stats.leasesAcquired.Add(1)
				c.allow(EndpointConnect, on...)
				return h, Decision{Allowed: true}
			case v[1] == 1:
				return nil, Decision{Rule: RuleUserCap, RetryAfter: capRetryAfter}
			default:
				if userCap > 0 {
					// The user's cap passed; the tenant's refused.
					c.allow(EndpointConnect, RuleUserCap)
				}
				return nil, Decision{Rule: RuleTenantCap, RetryAfter: capRetryAfter}
			}
		}
		c.failedFor(ctx, "acquire lease", err)
		doubtful = true
	}
	if rule := c.local.open(tenant, user, c.localShare(userCap), c.localShare(tenantCap), false); rule != "" {
		if rule == RuleTenantCap && userCap > 0 {
			c.allow(EndpointConnect, RuleUserCap)
		}
		if doubtful {
			c.leases.mu.Lock()
			c.leases.doubtful = append(c.leases.doubtful, h)
			c.leases.mu.Unlock()
		}
		return nil, Decision{Rule: rule, RetryAfter: capRetryAfter, Local: true}
	}
	// The lease is not in Redis yet: the first renewal that reaches Redis
	// writes it, so the fleet's counts include it, and its release then
	// removes it.
	c.leases.add(h)
	c.stats.leasesAcquired.Add(1)
	c.allow(EndpointConnect, on...)
	return h, Decision{Allowed: true, Local: true}
}

// acquireReply reads acquire.lua's reply: three integers, then the
// members of other users' expired leases.
func acquireReply(cmd *redis.Cmd) ([3]int64, []string, error) {
	var v [3]int64
	vals, err := cmd.Slice()
	if err != nil {
		return v, nil, err
	}
	if len(vals) < 3 {
		return v, nil, errors.New("admission: short script reply")
	}
	for i := range v {
		n, ok := vals[i].(int64)
		if !ok {
			return v, nil, fmt.Errorf("admission: script reply %d is %T", i, vals[i])
		}
		v[i] = n
	}
	dead := make([]string, 0, len(vals)-3)
	for _, m := range vals[3:] {
		if s, ok := m.(string); ok {
			dead = append(dead, s)
		}
	}
	return v, dead, nil
}

// purgeLater queues expired leases of tenant for the Controller's
// goroutine to purge in Redis.
func (c *Controller) purgeLater(tenant string, members []string) {
	if len(members) == 0 {
		return
	}
	c.leases.mu.Lock()
	for _, m := range members {
		c.leases.expired[m] = deadLease{tenant, m}
	}
	c.leases.mu.Unlock()
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// bgTimeout bounds one background round trip (a batch of renewals,
// releases or reconciles); admission never waits on it.
func (c *Controller) bgTimeout() time.Duration { return max(20*c.cfg.Timeout, 2*time.Second) }

// flushReleases releases in Redis the leases of connections that closed,
// and purges the expired leases acquires found. While Redis is down (or
// within RetryAfterFailure of a failure) they are dropped: they expire
// there on their own within LeaseTTL, and the reconcile removes them.
func (c *Controller) flushReleases() {
	c.leases.mu.Lock()
	rel := c.leases.released
	c.leases.released = nil
	// Taken only when it holds something, and then replaced: an empty map
	// kept here would still be the one purgeLater writes to, and reading
	// it below, outside the lock, would race with it.
	var expired map[string]deadLease
	if len(c.leases.expired) > 0 {
		expired = c.leases.expired
		c.leases.expired = make(map[string]deadLease)
	}
	c.leases.mu.Unlock()
	if len(rel)+len(expired) == 0 {
		return
	}
	if !c.useRedis() {
		// Kept for a flush once Redis answers again: dropped, each would
		// hold its slot of the caps until its lease expired, and an
		// overloaded Redis would see its tenants refused for slots nobody
		// holds. (The expired leases are found again by later acquires.)
		// Bounded: through a long outage, the closes past it are left
		// to their leases' expiry, as they all were before.
		c.leases.mu.Lock()
		if len(c.leases.released)+len(rel) <= maxKeptReleases {
			c.leases.released = append(c.leases.released, rel...)
		}
		c.leases.mu.Unlock()
		return
	}
	calls := make([]*scriptCall, 0, len(rel)+len(expired))
	for _, h := range rel {
		calls = append(calls, &scriptCall{script: releaseScript, keys: c.capKeys(h.tenant, h.user), args: []any{h.member, 0}})
	}
	purges := len(calls)
	for _, d := range expired {
		calls = append(calls, &scriptCall{script: releaseScript, keys: c.capKeys(d.tenant, leaseUser(d.member)), args: []any{d.member, 1}})
	}
	for i := 0; i < len(calls); i += batchSize {
		batch := calls[i:min(i+batchSize, len(calls))]
		ctx, cancel := context.WithTimeout(context.Background(), c.bgTimeout())
		err := runPipelined(ctx, c.rdb, batch)
		cancel()
		if err != nil {
			c.failed("release leases", err)
			return
		}
		for j, call := range batch {
			if v, err := call.cmd.Int64(); err == nil && v == 1 {
				if i+j < purges {
					c.stats.leasesReleased.Add(1)
				} else {
					c.stats.leasesExpired.Add(1)
				}
			}
		}
	}
}

// releaseDoubtful queues for release the doubtful holds of the renewal
// before last, and ages the last one's.
func (c *Controller) releaseDoubtful() {
	c.leases.mu.Lock()
	defer c.leases.mu.Unlock()
	c.leases.released = append(c.leases.released, c.leases.doubtfulOld...)
	c.leases.doubtfulOld, c.leases.doubtful = c.leases.doubtful, nil
}

// renew extends every lease the node holds, writing again those Redis
// lost, in one pipelined round trip (per batchSize leases of a tenant).
// It also registers the node's tenants for the reconcile. A renewal that
// succeeds brings the node back to Redis after a failure.
func (c *Controller) renew() {
	if c.rdb == nil {
		return
	}
	c.leases.mu.Lock()
	tenants := make(map[string][]*Hold, len(c.leases.byTenant))
	for t, m := range c.leases.byTenant {
		tenants[t] = slices.Collect(maps.Keys(m))
	}
	c.leases.mu.Unlock()
	if len(tenants) == 0 {
		return
	}
	var calls []*scriptCall
	reg := make(map[int][]any) // tenants by registry bucket
	for t, holds := range tenants {
		b := tenantBucket(t)
		reg[b] = append(reg[b], t)
		for len(holds) > 0 {
			n := min(len(holds), batchSize)
			keys := make([]string, 0, 2+n)
			keys = append(keys, c.names.leases(t), c.names.capTenant(t))
			args := make([]any, 0, 3+n)
			args = append(args, c.cfg.LeaseTTL.Milliseconds(), c.keyTTL(), c.userKeyTTL())
			for _, h := range holds[:n] {
				keys = append(keys, c.names.capUser(t, h.user))
				args = append(args, h.member)
			}
			holds = holds[n:]
			calls = append(calls, &scriptCall{script: renewScript, keys: keys, args: args})
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), c.bgTimeout())
	defer cancel()
	err := runPipelined(ctx, c.rdb, calls)
	if err == nil {
		err = c.register(ctx, reg)
	}
	if err != nil {
		c.failed("renew leases", err)
		return
	}
	for _, call := range calls {
		v, err := call.cmd.Int64()
		if err != nil {
			c.failed("renew leases", err)
			return
		}
		c.stats.leasesReadded.Add(v)
	}
	c.recovered()
}

// recovered ends a fallback early once a round trip succeeded, and the
// episode of failures if one is open.
func (c *Controller) recovered() {
	c.downUntil.Store(0)
	c.lost.OK("admission store answers again; using Redis limits")
}

// register adds tenants to their registry sets, by bucket: one SADD per
// bucket, in one pipeline.
func (c *Controller) register(ctx context.Context, byBucket map[int][]any) error {
	if len(byBucket) == 0 {
		return nil
	}
	pipe := c.rdb.Pipeline()
	for b, tenants := range byBucket {
		pipe.SAdd(ctx, c.names.tenants(b), tenants...)
	}
	_, err := pipe.Exec(ctx)
	return err
}

// loop is the Controller's one goroutine.
func (c *Controller) loop() {
	defer c.wg.Done()
	renew := time.NewTicker(c.cfg.RenewInterval)
	defer renew.Stop()
	reconcile := time.NewTicker(c.reconcileEvery())
	defer reconcile.Stop()
	// Nodes started together start their walks apart.
	step := mathrand.IntN(reconcileSteps)
	sessions := time.NewTicker(c.cfg.SessionCheckInterval)
	defer sessions.Stop()
	sweep := time.NewTicker(time.Minute)
	defer sweep.Stop()
	for {
		select {
		case <-c.done:
			c.flushReleases() // a node closing after its connections frees their slots at once
			return
		case <-c.wake:
			c.flushReleases()
		case <-renew.C:
			c.releaseDoubtful()
			c.flushReleases()
			c.renew()
		case <-reconcile.C:
			ctx, cancel := context.WithTimeout(context.Background(), c.bgTimeout())
			c.reconcileStep(ctx, step, true)
			cancel()
			step = (step + 1) % reconcileSteps
		case <-sessions.C:
			c.checkSessions()
		case now := <-sweep.C:
			c.local.sweep(now)
			c.plans.sweep(now)
		}
	}
}
