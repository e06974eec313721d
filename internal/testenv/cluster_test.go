package testenv_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/pushd/pushd/internal/testenv"
)

// TestRedisClusterServesEverySlotAndFailsOver: the cluster the fleet's
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
	c.WaitReplicated() // replication is asynchronous
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
		// slot map (pushd's cluster mode must do the same).
		cl.ReloadState(ctx)
		time.Sleep(50 * time.Millisecond) // the reload is asynchronous; poll the key with a deadline
	}
	victim.Start()
	c.WaitOK()
	if n := len(c.Masters()); n != 3 {
		t.Fatalf("after the old master rejoined: %d masters, want 3", n)
	}
}
