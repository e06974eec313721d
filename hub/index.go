package hub

import (
	"hash/maphash"
	"sync"
	"sync/atomic"
)

// shardCount spreads the routing index over locks, so subscribes, closes
// and deliveries of different tasks rarely wait for each other.
const shardCount = 64

// kinds of index entries.
const (
	byTask = iota
	byProject
	byUser
	kinds
)

// index maps (tenant, task | project | user) to the local connections that
// watch it. Lock order: Hub.mu, then Conn.mu, then a shard's mu; nothing is
// locked while a shard's mu is held.
type index struct {
	seed   maphash.Seed
	shards [shardCount]indexShard
	// hotAt is the number of connections watching a task by id that makes
	// it hot (Config.HotTaskWatchers); hotCrossings counts the times a task
	// reached it, once per crossing: again only after it fell below.
	hotAt        int
	hotCrossings atomic.Int64
}

type indexShard struct {
	mu     sync.RWMutex
	sets   [kinds]map[key]connSet
	scoped map[string]int   // per tenant whose key hashes here, connections watching a project or a user
	hot    map[key]struct{} // tasks watched by id by hotAt connections or more
}

func (x *index) init(hotAt int) {
	x.seed = maphash.MakeSeed()
	x.hotAt = hotAt
	for i := range x.shards {
		for k := range kinds {
			x.shards[i].sets[k] = make(map[key]connSet)
		}
		x.shards[i].scoped = make(map[string]int)
		x.shards[i].hot = make(map[key]struct{})
	}
}

func (x *index) shard(k key) *indexShard {
	return &x.shards[maphash.Comparable(x.seed, k)%shardCount]
}

func (x *index) add(kind int, k key, c *Conn) {
	sh := x.shard(k)
	sh.mu.Lock()
	set := addConn(sh.sets[kind][k], c)
	sh.sets[kind][k] = set
	if kind == byTask && len(set) >= x.hotAt {
		if _, was := sh.hot[k]; !was {
			sh.hot[k] = struct{}{}
			x.hotCrossings.Add(1)
		}
	}
	sh.mu.Unlock()
}

func (x *index) remove(kind int, k key, c *Conn) {
	sh := x.shard(k)
	sh.mu.Lock()
	removeConn(sh.sets[kind], k, c)
	if kind == byTask && len(sh.hot) > 0 && len(sh.sets[kind][k]) < x.hotAt {
		delete(sh.hot, k)
	}
	sh.mu.Unlock()
}

// hotTasks is the number of tasks hot now.
func (x *index) hotTasks() int {
	n := 0
	for i := range x.shards {
		sh := &x.shards[i]
		sh.mu.RLock()
		n += len(sh.hot)
		sh.mu.RUnlock()
	}
	return n
}

// has reports whether any connection is indexed under k.
func (x *index) has(kind int, k key) bool {
	sh := x.shard(k)
	sh.mu.RLock()
	defer sh.mu.RUnlock()
	return len(sh.sets[kind][k]) > 0
}

// collect appends the connections indexed under k to dst.
func (x *index) collect(kind int, k key, dst []*Conn) []*Conn {
	sh := x.shard(k)
	sh.mu.RLock()
	for c := range sh.sets[kind][k] {
		dst = append(dst, c)
	}
	sh.mu.RUnlock()
	return dst
}

// addScoped counts a connection of tenant that watches projects or its user.
func (x *index) addScoped(tenant string, delta int) {
	sh := x.shard(key{tenant: tenant})
	sh.mu.Lock()
	if sh.scoped[tenant] += delta; sh.scoped[tenant] <= 0 {
		delete(sh.scoped, tenant)
	}
	sh.mu.Unlock()
}

func (x *index) scopedIn(tenant string) bool {
	sh := x.shard(key{tenant: tenant})
	sh.mu.RLock()
	defer sh.mu.RUnlock()
	return sh.scoped[tenant] > 0
}

// tasks returns the ids of every watched task of the given tenants (all
// tenants when nil), once each.
func (x *index) tasks(tenants map[string]struct{}) []string {
	seen := make(map[string]struct{})
	var ids []string
	for i := range x.shards {
		sh := &x.shards[i]
		sh.mu.RLock()
		for k := range sh.sets[byTask] {
			if _, ok := tenants[k.tenant]; tenants != nil && !ok {
				continue
			}
			if _, ok := seen[k.id]; !ok {
				seen[k.id] = struct{}{}
				ids = append(ids, k.id)
			}
		}
		sh.mu.RUnlock()
	}
	return ids
}

func addConn(s connSet, c *Conn) connSet {
	if s == nil {
		s = make(connSet)
	}
	s[c] = struct{}{}
	return s
}

func removeConn(idx map[key]connSet, k key, c *Conn) {
	s := idx[k]
	delete(s, c)
	if len(s) == 0 {
		delete(idx, k)
	}
}
