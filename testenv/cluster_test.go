package testenv_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pushd/pushd/testenv"
)

// TestRedisClusterServesEverySlotAndFailsOver: the cluster issue 10's
// tests run on has three masters with a replica each, serves keys of every
// slot, and when a master is killed its replica takes over, keeping what
// was written; the killed node rejoins as a replica.
func TestRedisClusterServesEverySlotAndFailsOver(t *testing.T) {
	c := testenv.StartRedisCluster(t, 3)
	if n := len(c.Masters()); n != 3 {
		t.Fatalf("%d masters, want 3", n)
	}
	cl := c.Client()
	ctx := context.Background()
	const keys = 200 // spread over the slots, so over every master
	for i := range keys {
		if err := cl.Set(ctx, fmt.Sprintf("key:%d", i), i, 0).Err(); err != nil {
			t.Fatal(err)
		}
	}
	// Replication is asynchronous: let every master's replica catch up
	// before one master dies. A replica still in its first full sync
	// acknowledges nothing, so WAIT is asked again (each call shorter than
	// the client's 3 s read timeout) until one does.
	if err := cl.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
		deadline := time.Now().Add(20 * time.Second)
		for {
			n, err := m.Do(ctx, "WAIT", 1, 1000).Int()
			if err == nil && n >= 1 {
				return nil
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("%s: no replica acknowledged the writes within 20s (last: %d, %v)", m.Options().Addr, n, err)
			}
		}
	}); err != nil {
		t.Fatal(err)
	}
	victim := c.Masters()[0]
	victim.Stop()
	c.WaitOK()
	if n := len(c.Masters()); n != 3 {
		t.Fatalf("after the failover: %d masters, want 3 (the replica promoted)", n)
	}
	deadline := time.Now().Add(10 * time.Second)
	for i := 0; i < keys; {
		v, err := cl.Get(ctx, fmt.Sprintf("key:%d", i)).Int()
		if err == nil && v == i {
			i++
			continue
		}
		if time.Now().After(deadline) {
			t.Fatalf("key:%d after the failover: %v, %v", i, v, err)
		}
		// go-redis keeps dialing the dead master until it reloads the
		// slot map (pushd's cluster mode must do the same, issue 10).
		cl.ReloadState(ctx)
		time.Sleep(50 * time.Millisecond) // the reload is asynchronous; poll the key with a deadline
	}
	victim.Start()
	c.WaitOK()
	if n := len(c.Masters()); n != 3 {
		t.Fatalf("after the old master rejoined: %d masters, want 3", n)
	}
}
