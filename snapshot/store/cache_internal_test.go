package store

import (
	"fmt"
	"testing"
	"testing/synctest"
	"time"
)

func TestCacheExpires(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newCache[int](time.Second, 1024)
		c.put("a", 1)
		if v, ok := c.get("a"); !ok || v != 1 {
			t.Fatalf("get = %v, %v", v, ok)
		}
		time.Sleep(999 * time.Millisecond)
		if _, ok := c.get("a"); !ok {
			t.Fatal("expired early")
		}
		time.Sleep(2 * time.Millisecond)
		if _, ok := c.get("a"); ok {
			t.Fatal("served after its TTL")
		}
		// update still sees the expired entry: it tells the newest version
		// this node saw.
		got := c.update("a", func(old int, present bool) int {
			if !present || old != 1 {
				t.Errorf("update saw %v, %v; want the expired 1", old, present)
			}
			return 2
		})
		if v, ok := c.get("a"); got != 2 || !ok || v != 2 {
			t.Fatalf("after update: get = %v, %v", v, ok)
		}
	})
}

func TestCacheBounded(t *testing.T) {
	const capacity = 1024
	c := newCache[int](time.Hour, capacity)
	for i := range 10 * capacity {
		c.put(fmt.Sprint("k", i), i)
		if n := c.len(); n > capacity {
			t.Fatalf("%d entries after %d inserts, cap %d", n, i+1, capacity)
		}
	}
	// The newest entry survives the eviction its insert caused.
	if v, ok := c.get(fmt.Sprint("k", 10*capacity-1)); !ok || v != 10*capacity-1 {
		t.Fatalf("newest entry: %v, %v", v, ok)
	}
}

func TestCacheEvictsExpiredFirst(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newCache[int](time.Second, cacheShards*8)
		// Keys of one shard, so the test knows when it is full.
		var keys []string
		for i := 0; len(keys) < 2*c.shardCap; i++ {
			if k := fmt.Sprint("k", i); c.shard(k) == &c.shards[0] {
				keys = append(keys, k)
			}
		}
		old, fresh := keys[:c.shardCap], keys[c.shardCap:2*c.shardCap-1]
		for _, k := range old {
			c.put(k, 1)
		}
		time.Sleep(2 * time.Second)
		for _, k := range fresh {
			c.put(k, 2)
		}
		// The full shard dropped its expired entries, not a fresh one.
		for _, k := range fresh {
			if _, ok := c.get(k); !ok {
				t.Fatalf("fresh entry %s evicted while expired ones remained", k)
			}
		}
		if n := len(c.shards[0].m); n != len(fresh) {
			t.Fatalf("shard holds %d entries, want the %d fresh ones", n, len(fresh))
		}
	})
}

func TestCacheDisabled(t *testing.T) {
	c := newCache[int](-1, 1024)
	c.put("a", 1)
	if _, ok := c.get("a"); ok || c.len() != 0 {
		t.Fatal("a disabled cache stored an entry")
	}
	if got := c.update("a", func(int, bool) int { return 7 }); got != 7 {
		t.Fatalf("update = %d, want 7", got)
	}
}
