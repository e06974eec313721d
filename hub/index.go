package hub

import (
	"hash/maphash"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pushd/pushd/snapshot"
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
// watch it. A shard's mu is a leaf of the hub's lock order (see doc.go).
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
	sets   [kinds]map[key]watchers
	scoped map[string]int       // per tenant whose key hashes here, connections watching a project or a user
	since  [kinds]map[key]int64 // when a project or user key was indexed, Unix ms (none for tasks)
	hot    map[key]struct{}     // tasks watched by id by hotAt connections or more
}

func (x *index) init(hotAt int) {
	x.seed = maphash.MakeSeed()
	x.hotAt = hotAt
	for i := range x.shards {
		for k := range kinds {
			x.shards[i].sets[k] = make(map[key]watchers)
		}
		x.shards[i].scoped = make(map[string]int)
		x.shards[i].since[byProject] = make(map[key]int64)
		x.shards[i].since[byUser] = make(map[key]int64)
		x.shards[i].hot = make(map[key]struct{})
	}
}

func (x *index) shard(k key) *indexShard {
	return &x.shards[maphash.Comparable(x.seed, k)%shardCount]
}

func (x *index) add(kind int, k key, c *Conn) {
	sh := x.shard(k)
	sh.mu.Lock()
	if _, ok := sh.sets[kind][k]; !ok && kind != byTask {
		sh.since[kind][k] = time.Now().UnixMilli()
	}
	w := sh.sets[kind][k].add(c)
	sh.sets[kind][k] = w
	if kind == byTask && w.len() >= x.hotAt {
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
	if w := sh.sets[kind][k].remove(c); w.len() == 0 {
		delete(sh.sets[kind], k)
		delete(sh.since[kind], k) // a no-op for a task
	} else {
		sh.sets[kind][k] = w
	}
	if kind == byTask && len(sh.hot) > 0 && sh.sets[kind][k].len() < x.hotAt {
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
	return sh.sets[kind][k].len() > 0
}

// collect appends the connections indexed under k to dst.
func (x *index) collect(kind int, k key, dst []*Conn) []*Conn {
	sh := x.shard(k)
	sh.mu.RLock()
	w := sh.sets[kind][k]
	if w.one != nil {
		dst = append(dst, w.one)
	}
	for c := range w.set {
		dst = append(dst, c)
	}
	sh.mu.RUnlock()
	return dst
}

// noteOf returns the note of task k, made on first use, or nil when no
// connection here watches the task by id. The shard's write lock is taken
// once per watched task, to make the note; then only its read lock.
func (x *index) noteOf(k key) *taskNote {
	sh := x.shard(k)
	sh.mu.RLock()
	w, ok := sh.sets[byTask][k]
	sh.mu.RUnlock()
	if !ok || w.note != nil {
		return w.note
	}
	sh.mu.Lock()
	defer sh.mu.Unlock()
	w, ok = sh.sets[byTask][k]
	if !ok {
		return nil
	}
	if w.note == nil {
		w.note = new(taskNote)
		sh.sets[byTask][k] = w
	}
	return w.note
}

// peekNote is noteOf without making one.
func (x *index) peekNote(k key) *taskNote {
	sh := x.shard(k)
	sh.mu.RLock()
	defer sh.mu.RUnlock()
	return sh.sets[byTask][k].note
}

// collectUpTo is collect of at most limit connections; total is how many
// are indexed under k. The shard is read-locked for the copy of at most
// limit pointers, however many watch.
func (x *index) collectUpTo(kind int, k key, dst []*Conn, limit int) (_ []*Conn, total int) {
	sh := x.shard(k)
	sh.mu.RLock()
	defer sh.mu.RUnlock()
	w := sh.sets[kind][k]
	total = w.len()
	if limit <= 0 {
		return dst, total
	}
	if w.one != nil {
		return append(dst, w.one), total
	}
	for c := range w.set {
		if limit == 0 {
			break
		}
		dst = append(dst, c)
		limit--
	}
	return dst, total
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

// scopes returns every watched project and user scope, once each.
func (x *index) scopes() []snapshot.Scope {
	var out []snapshot.Scope
	for i := range x.shards {
		sh := &x.shards[i]
		sh.mu.RLock()
		for k := range sh.sets[byProject] {
			out = append(out, snapshot.Scope{TenantID: k.tenant, ProjectID: k.id, WatchedSince: sh.since[byProject][k]})
		}
		for k := range sh.sets[byUser] {
			out = append(out, snapshot.Scope{TenantID: k.tenant, UserID: k.id, WatchedSince: sh.since[byUser][k]})
		}
		sh.mu.RUnlock()
	}
	return out
}

// watchers are the connections indexed under one key. Most tasks have one
// watcher (a user watching a generation of their own), kept inline: a set
// is made for a second, and kept until the key has none.
type watchers struct {
	one *Conn   // the only watcher, when set is nil
	set connSet // every watcher, once there were two
	// note is what the node last heard and read of a task watched by id
	// (byTask only), made on first use and gone with the entry.
	note *taskNote
}

func (w watchers) len() int {
	if w.set != nil {
		return len(w.set)
	}
	if w.one != nil {
		return 1
	}
	return 0
}

func (w watchers) add(c *Conn) watchers {
	switch {
	case w.set != nil:
		w.set[c] = struct{}{}
	case w.one == nil || w.one == c:
		w.one = c
	default:
		w.set = connSet{w.one: {}, c: {}}
		w.one = nil
	}
	return w
}

func (w watchers) remove(c *Conn) watchers {
	if w.set != nil {
		delete(w.set, c)
	} else if w.one == c {
		w.one = nil
	}
	return w
}
