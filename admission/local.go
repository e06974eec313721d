package admission

import (
	"math"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// local holds the node's own limits: the buckets used while Redis is down
// (or absent), and the node's open connections per user and tenant, always
// kept, which the local caps check.
type local struct {
	mu      sync.Mutex // guards the maps
	buckets map[string]*rate.Limiter
	users   map[[2]string]int // open connections on this node by tenant and user
	tenants map[string]int    // open connections on this node by tenant
}

func (l *local) init() {
	l.buckets = make(map[string]*rate.Limiter)
	l.users = make(map[[2]string]int)
	l.tenants = make(map[string]int)
}

// take takes a token from the bucket named key (made full on first use)
// and reports how long until one would be there when it is empty.
func (l *local) take(key string, perSecond float64, burst int, now time.Time) (time.Duration, bool) {
	l.mu.Lock()
	lim, ok := l.buckets[key]
	if !ok {
		lim = rate.NewLimiter(rate.Limit(perSecond), burst)
		l.buckets[key] = lim
	}
	l.mu.Unlock()
	if lim.AllowN(now, 1) {
		return 0, true
	}
	missing := 1 - lim.TokensAt(now)
	return time.Duration(math.Ceil(missing / perSecond * float64(time.Second))), false
}

// sweep forgets buckets that are full again: a full bucket and no bucket
// are the same, so memory follows only recent callers.
func (l *local) sweep(now time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for k, lim := range l.buckets {
		if lim.TokensAt(now) >= float64(lim.Burst()) {
			delete(l.buckets, k)
		}
	}
}

// open counts a connection on this node if the local caps allow it (a cap
// <= 0 is none), or counts it regardless when force is set.
func (l *local) open(tenant, user string, userCap, tenantCap int, force bool) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	uk := [2]string{tenant, user}
	if !force {
		if userCap > 0 && l.users[uk] >= userCap {
			return RuleUserCap
		}
		if tenantCap > 0 && l.tenants[tenant] >= tenantCap {
			return RuleTenantCap
		}
	}
	l.users[uk]++
	l.tenants[tenant]++
	return ""
}

func (l *local) close(tenant, user string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	uk := [2]string{tenant, user}
	if l.users[uk]--; l.users[uk] <= 0 {
		delete(l.users, uk)
	}
	if l.tenants[tenant]--; l.tenants[tenant] <= 0 {
		delete(l.tenants, tenant)
	}
}
