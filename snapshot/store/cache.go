package store

import (
	"hash/maphash"
	"math"
	"sync"
	"sync/atomic"
	"time"
)

// cacheShards spreads a cache over several locks, so readers on many cores do
// not all touch one RWMutex.
const cacheShards = 16

// epoch anchors monotonic cache clocks: time.Since reads the monotonic clock,
// so a wall-clock step cannot make every entry expire or live forever.
var epoch = time.Now()

func monotime() int64 { return int64(time.Since(epoch)) }

// cache is an in-process map with per-entry expiry and a size cap. It is not
// an LRU: its entries live a second or so, so when a shard is full an insert
// drops the expired entries and then, if that was not enough, arbitrary ones
// (Go map iteration order is random) down to 7/8 of the cap. The eviction is
// O(shard) but runs at most once per cap/8 inserts.
//
// A timer sweeps the entries that expired, so a node whose tasks went quiet
// does not keep their values until the cap forces them out: at 10,000 idle
// connections watching a task each, the snapshots behind them were a fifth
// of the node's heap. The sweep deletes an expired entry, or, with a remnant
// function, keeps what that returns in its stead: an entry no get serves,
// which update still sees. The timer runs while entries it has not swept
// remain, and stops by itself when none do.
type cache[V any] struct {
	seed       maphash.Seed
	ttl        int64 // nanoseconds; <= 0 disables the cache
	shardCap   int
	remnant    func(V) V // what a sweep keeps of an expired entry; nil deletes it
	sweepArmed atomic.Bool
	shards     [cacheShards]cacheShard[V]
}

// swept is the expiry of a remnant: never served, never swept again, and
// the first to go when a full shard evicts.
const swept = math.MinInt64

type cacheShard[V any] struct {
	mu sync.RWMutex
	m  map[string]cacheItem[V] // guarded by mu
}

type cacheItem[V any] struct {
	v   V
	exp int64 // monotime after which the entry is not served
}

func newCache[V any](ttl time.Duration, capacity int) *cache[V] {
	c := &cache[V]{seed: maphash.MakeSeed(), ttl: int64(ttl), shardCap: max(capacity/cacheShards, 8)}
	for i := range c.shards {
		c.shards[i].m = make(map[string]cacheItem[V])
	}
	return c
}

func (c *cache[V]) shard(key string) *cacheShard[V] {
	return &c.shards[maphash.String(c.seed, key)%cacheShards]
}

// get returns the unexpired value of key.
func (c *cache[V]) get(key string) (v V, ok bool) {
	if c.ttl <= 0 {
		return v, false
	}
	sh := c.shard(key)
	sh.mu.RLock()
	it, ok := sh.m[key]
	sh.mu.RUnlock()
	if !ok || it.exp < monotime() {
		return v, false
	}
	return it.v, true
}

// put stores v under key for the cache's TTL.
func (c *cache[V]) put(key string, v V) {
	c.update(key, func(V, bool) (V, bool) { return v, true })
}

// update stores f(old, present) under key for the cache's TTL, atomically
// with respect to other updates of key, and returns what it stored; when f
// answers store false, the entry is left as it was and update returns
// f's value. present reports whether an entry exists, expired, a remnant or
// neither: an expired entry still tells which version this node has seen.
// With the cache disabled it returns f(zero, false) and stores nothing.
func (c *cache[V]) update(key string, f func(old V, present bool) (v V, store bool)) V {
	return c.updateFor(key, 0, f)
}

// updateFor is update with the entry kept for ttl instead, when that is
// longer than the cache's TTL.
func (c *cache[V]) updateFor(key string, ttl time.Duration, f func(old V, present bool) (v V, store bool)) V {
	if c.ttl <= 0 {
		var zero V
		v, _ := f(zero, false)
		return v
	}
	sh := c.shard(key)
	now := monotime()
	sh.mu.Lock()
	old, present := sh.m[key]
	v, store := f(old.v, present)
	if !store {
		sh.mu.Unlock()
		return v
	}
	if !present && len(sh.m) >= c.shardCap {
		sh.evict(now, c.shardCap-c.shardCap/8)
	}
	sh.m[key] = cacheItem[V]{v: v, exp: now + max(c.ttl, int64(ttl))}
	sh.mu.Unlock()
	c.armSweep()
	return v
}

// armSweep schedules a sweep, a TTL or a second from now, whichever is
// later, unless one is scheduled.
func (c *cache[V]) armSweep() {
	if !c.sweepArmed.Load() && c.sweepArmed.CompareAndSwap(false, true) {
		time.AfterFunc(max(time.Duration(c.ttl), time.Second), c.sweep)
	}
}

func (c *cache[V]) sweep() {
	c.sweepArmed.Store(false)
	if c.sweepAt(monotime()) {
		c.armSweep()
	}
}

// sweepAt deletes the entries expired at now, or replaces them with their
// remnants, and reports whether unexpired entries remain. It holds one
// shard's lock at a time, for one pass over that shard.
func (c *cache[V]) sweepAt(now int64) (unexpired bool) {
	for i := range c.shards {
		sh := &c.shards[i]
		sh.mu.Lock()
		for k, it := range sh.m {
			switch {
			case it.exp == swept:
			case it.exp >= now:
				unexpired = true
			case c.remnant == nil:
				delete(sh.m, k)
			default:
				sh.m[k] = cacheItem[V]{v: c.remnant(it.v), exp: swept}
			}
		}
		sh.mu.Unlock()
	}
	return unexpired
}

func (c *cache[V]) delete(key string) {
	if c.ttl <= 0 {
		return
	}
	sh := c.shard(key)
	sh.mu.Lock()
	delete(sh.m, key)
	sh.mu.Unlock()
}

// evict drops expired entries, then arbitrary ones, until at most keep
// remain. The caller holds sh.mu.
func (sh *cacheShard[V]) evict(now int64, keep int) {
	for k, it := range sh.m {
		if it.exp < now {
			delete(sh.m, k)
		}
	}
	for k := range sh.m {
		if len(sh.m) <= keep {
			break
		}
		delete(sh.m, k)
	}
}

func (c *cache[V]) len() int {
	n := 0
	for i := range c.shards {
		sh := &c.shards[i]
		sh.mu.RLock()
		n += len(sh.m)
		sh.mu.RUnlock()
	}
	return n
}

// raise stores v under key unless a higher value is stored: update for
// versions, without a closure to allocate on every notification.
func raise(c *cache[int64], key string, v int64) {
	sh := c.shard(key)
	now := monotime()
	sh.mu.Lock()
	old, present := sh.m[key]
	if present && old.v > v {
		v = old.v
	}
	if !present && len(sh.m) >= c.shardCap {
		sh.evict(now, c.shardCap-c.shardCap/8)
	}
	sh.m[key] = cacheItem[int64]{v: v, exp: now + c.ttl}
	sh.mu.Unlock()
	c.armSweep()
}
