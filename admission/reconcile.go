package admission

import (
	"context"
	"maps"
	"slices"
	"time"

	"github.com/redis/go-redis/v9"
)

// reconcileSteps are the stops of the reconcile's walk: each registry
// bucket, then the legacy set.
const reconcileSteps = tenantBuckets + 1

// Reconcile rebuilds the open-connection counts of every registered tenant
// from its live leases and returns the total difference it repaired. The
// Controller's goroutine does the same one registry bucket at a time,
// spread over each ReconcileInterval, for the tenants no other node
// reconciled lately; Reconcile, all at once and every tenant, is exported
// for operators' tools and tests.
func (c *Controller) Reconcile(ctx context.Context) (int64, error) {
	var total int64
	for step := range reconcileSteps {
		diff, err := c.reconcileStep(ctx, step, false)
		total += diff
		if err != nil {
			return total, err
		}
	}
	return total, nil
}

// reconcileStep reconciles the tenants of one stop of the walk: registry
// bucket step, with the tenants seen here since its last reconcile, or the
// legacy set, whose tenants it moves to their buckets (those with live
// leases) and removes. shared (the walk's) reconciles only the tenants it
// claims for the fleet.
func (c *Controller) reconcileStep(ctx context.Context, step int, shared bool) (int64, error) {
	if c.rdb == nil {
		return 0, nil
	}
	legacy := step == tenantBuckets
	key := c.names.legacyTenants()
	var seen map[string]map[string]struct{}
	if !legacy {
		key = c.names.tenants(step)
		seen = c.leases.takeSeen(step)
	}
	total, err := c.reconcileSet(ctx, key, seen, legacy, shared)
	if err != nil {
		c.leases.putSeen(step, seen)
		c.failed("reconcile", err)
	}
	return total, err
}

// reconcileSet reconciles the tenants of registry set key and those of
// seen, and removes from the set the tenants left without a lease (every
// tenant, for the legacy set, after registering those with leases in their
// buckets).
func (c *Controller) reconcileSet(ctx context.Context, key string, seen map[string]map[string]struct{}, legacy, shared bool) (int64, error) {
	tenants, err := c.rdb.SMembers(ctx, key).Result()
	if err != nil {
		return 0, err
	}
	for t := range seen {
		tenants = append(tenants, t)
	}
	slices.Sort(tenants)
	tenants = slices.Compact(tenants)
	var total int64
	for len(tenants) > 0 {
		n := min(len(tenants), 100)
		batch := tenants[:n]
		tenants = tenants[n:]
		diff, done, live, err := c.reconcileTenants(ctx, batch, seen, shared)
		total += diff
		if err != nil {
			return total, err
		}
		var gone []any
		moved, nMoved := make(map[int][]any), 0
		for i, t := range batch {
			if !done[i] {
				continue
			}
			if legacy && live[i] {
				moved[tenantBucket(t)] = append(moved[tenantBucket(t)], t)
				nMoved++
			}
			if legacy || !live[i] {
				gone = append(gone, t)
			}
		}
		// A tenant moves to its bucket before it leaves the legacy set, so
		// a failure between leaves it in both rather than in neither.
		if err := c.register(ctx, moved); err != nil {
			return total, err
		}
		// A tenant with no lease leaves the registry; a node that takes one
		// later registers it again on its next renewal.
		if len(gone) > 0 {
			c.rdb.SRem(ctx, key, gone...)
		}
		if legacy && len(gone) > 0 {
			c.log.Info("legacy tenant registry drained", "key", key, "tenants", len(gone), "moved to buckets", nMoved)
		}
	}
	return total, nil
}

// reconcileTenants runs the reconcile script for the tenants of batch this
// node reconciles and reports the difference repaired, which it reconciled
// (done) and which of those have live leases.
//
// Every node walks every registered tenant, so with shared a node
// reconciles a tenant only if it claims it: no node did for most of a
// ReconcileInterval. Without the claim every node read every lease of the
// fleet each interval, a cost of nodes times connections. The users seen
// here go to the tenant's shared set whoever reconciles it: the node that
// does checks their counts, lease or none.
func (c *Controller) reconcileTenants(ctx context.Context, batch []string, seen map[string]map[string]struct{}, shared bool) (int64, []bool, []bool, error) {
	done := make([]bool, len(batch))
	claims := make([]*redis.BoolCmd, len(batch))
	pipe := c.rdb.Pipeline()
	for i, t := range batch {
		if shared {
			claims[i] = pipe.SetNX(ctx, c.names.reconciled(t), 1, c.cfg.ReconcileInterval*9/10)
		}
		if users := seen[t]; len(users) > 0 {
			pipe.SAdd(ctx, c.names.seenUsers(t), anys(slices.Collect(maps.Keys(users)))...)
			pipe.PExpire(ctx, c.names.seenUsers(t), 2*c.cfg.ReconcileInterval+c.cfg.LeaseTTL)
		}
	}
	if pipe.Len() > 0 {
		if _, err := pipe.Exec(ctx); err != nil {
			return 0, done, done, err
		}
	}
	// The script may touch only keys it is given: the count keys of the
	// users of every lease, read first, and of the users seen.
	var mine []int // the batch's tenants this node reconciles
	pipe = c.rdb.Pipeline()
	read := make([]*redis.StringSliceCmd, len(batch))
	seenRead := make([]*redis.StringSliceCmd, len(batch))
	for i, t := range batch {
		if done[i] = !shared || claims[i].Val(); done[i] {
			mine = append(mine, i)
			read[i] = pipe.ZRange(ctx, c.names.leases(t), 0, -1)
			seenRead[i] = pipe.SMembers(ctx, c.names.seenUsers(t))
		}
	}
	if len(mine) == 0 {
		return 0, done, done, nil
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return 0, done, done, err
	}
	calls := make([]*scriptCall, len(mine))
	for j, i := range mine {
		t := batch[i]
		users := make(map[string]struct{})
		for _, u := range seenRead[i].Val() {
			users[u] = struct{}{}
		}
		for _, m := range read[i].Val() {
			users[leaseUser(m)] = struct{}{}
		}
		keys := make([]string, 0, 2+len(users))
		keys = append(keys, c.names.leases(t), c.names.capTenant(t))
		for u := range users {
			keys = append(keys, c.names.capUser(t, u))
		}
		calls[j] = &scriptCall{script: reconcileScript, keys: keys, args: []any{c.names.capUserPrefix(t), c.keyTTL(), c.userKeyTTL()}}
	}
	if err := runPipelined(ctx, c.rdb, calls); err != nil {
		return 0, done, done, err
	}
	var total int64
	live := make([]bool, len(batch))
	pipe = c.rdb.Pipeline()
	for j, i := range mine {
		t := batch[i]
		v, err := ints(calls[j].cmd, 3)
		if err != nil {
			return total, done, live, err
		}
		c.stats.reconciles.Add(1)
		c.stats.leasesExpired.Add(v[0])
		if v[1] != 0 {
			c.stats.reconcileDiff.Add(v[1])
			total += v[1]
			c.log.Warn("connection counts repaired from live leases", "tenant", t, "difference", v[1], "live", v[2])
		}
		live[i] = v[2] != 0
		if users := seenRead[i].Val(); len(users) > 0 {
			// Only those checked: a user seen meanwhile stays for the next.
			pipe.SRem(ctx, c.names.seenUsers(t), anys(users)...)
		}
	}
	if pipe.Len() > 0 {
		if _, err := pipe.Exec(ctx); err != nil {
			return total, done, live, err
		}
	}
	return total, done, live, nil
}

// reconcileEvery is the period of the reconcile's steps: the walk over
// every bucket takes one ReconcileInterval, in steps small enough not to
// load Redis all at once.
func (c *Controller) reconcileEvery() time.Duration {
	return max(c.cfg.ReconcileInterval/reconcileSteps, time.Millisecond)
}
