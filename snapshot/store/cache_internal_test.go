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
		got := c.update("a", func(old int, present bool) (int, bool) {
			if !present || old != 1 {
				t.Errorf("update saw %v, %v; want the expired 1", old, present)
			}
			return 2, true
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
	if got := c.update("a", func(int, bool) (int, bool) { return 7, true }); got != 7 {
		t.Fatalf("update = %d, want 7", got)
	}
}

func TestCacheSweepsExpiredEntries(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newCache[int](time.Second, 1024)
		c.put("a", 1)
		c.put("b", 2)
		time.Sleep(500 * time.Millisecond)
		if n := c.len(); n != 2 {
			t.Fatalf("%d entries before they expired, want 2", n)
		}
		time.Sleep(3 * time.Second)
		synctest.Wait()
		if n := c.len(); n != 0 {
			t.Fatalf("%d entries left after they expired, want none", n)
		}
		if c.sweepArmed.Load() {
			t.Fatal("a sweep is still scheduled with nothing to sweep")
		}
	})
}

func TestCacheSweepKeepsRemnants(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newCache[int](time.Second, 1024)
		c.remnant = func(v int) int { return -v }
		c.put("a", 1)
		time.Sleep(1900 * time.Millisecond)
		c.put("b", 2)
		// The sweep at 2 s finds a expired and b fresh.
		time.Sleep(200 * time.Millisecond)
		synctest.Wait()
		if _, ok := c.get("a"); ok {
			t.Fatal("a remnant was served")
		}
		if v, ok := c.get("b"); !ok || v != 2 {
			t.Fatalf("fresh entry: get = %v, %v", v, ok)
		}
		c.update("a", func(old int, present bool) (int, bool) {
			if !present || old != -1 {
				t.Errorf("update saw %v, %v; want the remnant -1", old, present)
			}
			return old, false
		})
		if _, ok := c.get("a"); ok {
			t.Fatal("an update that stored nothing made the remnant servable")
		}
		// The next sweep makes b a remnant too, and none is scheduled after.
		time.Sleep(2 * time.Second)
		synctest.Wait()
		for i := range c.shards {
			sh := &c.shards[i]
			sh.mu.RLock()
			for k, it := range sh.m {
				if it.exp != swept || it.v >= 0 {
					t.Errorf("%s: %v, expiry %d; want a remnant", k, it.v, it.exp)
				}
			}
			sh.mu.RUnlock()
		}
		if n := c.len(); n != 2 {
			t.Fatalf("%d entries, want the 2 remnants", n)
		}
		if c.sweepArmed.Load() {
			t.Fatal("a sweep is still scheduled with only remnants left")
		}
	})
}
