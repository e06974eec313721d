package fanout_test

import (
	"context"
	"fmt"
	"log"

	"github.com/redis/go-redis/v9"

	"github.com/pushd/pushd/fanout"
	"github.com/pushd/pushd/keys"
	"github.com/pushd/pushd/snapshot"
)

// NewRedisPublisher takes the client of the Redis the nodes read and the
// nodes' key names (their --key-prefix as Prefix). Publish stores a snapshot
// only if its version is newer than the stored one; a stale one is neither
// stored nor announced: publishing version 18 and then 17 prints
// "written: true" and then "written: false". (No Output line: the example
// would need the test suite's Redis, which PUSHD_TEST_REDIS_URL may move;
// the publisher's tests check exactly this against it.)
func ExampleNewRedisPublisher() {
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"})
	defer rdb.Close()
	pub := fanout.NewRedisPublisher(rdb, keys.Names{}) // the nodes' --key-prefix, if any, as Prefix

	for _, version := range []int{18, 17} {
		s, err := snapshot.Parse(fmt.Appendf(nil, `{"task_id":"task_123","tenant_id":"t1",
			"status":"RUNNING","progress":45,"version":%d,"updated_at":1710000000000}`, version))
		if err != nil {
			log.Fatal(err)
		}
		written, err := pub.Publish(context.Background(), s)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Printf("version %d written: %v\n", version, written)
	}
}

// A Task State Service publishes each state change after committing it to
// PostgreSQL: one round trip stores the snapshot if it is newer and, only
// then, tells the pushd nodes. A publish that fails is retried or left to the
// nodes' polling; PostgreSQL stays the truth.
func ExampleRedisPublisher() {
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"})
	defer rdb.Close()
	pub := fanout.NewRedisPublisher(rdb, keys.Names{}) // the nodes' names

	s, err := snapshot.Parse([]byte(`{"task_id":"task_123","tenant_id":"t1","project_id":"p1",
		"user_id":"u1","status":"RUNNING","progress":45,"version":18,"updated_at":1710000000000}`))
	if err != nil {
		log.Fatal(err)
	}
	written, err := pub.Publish(context.Background(), s)
	if err != nil {
		log.Printf("publish %s: %v", s.TaskID, err)
		return
	}
	if !written {
		log.Printf("%s: version %d is stale, nothing announced", s.TaskID, s.Version)
	}
}

// On Redis Cluster the publisher takes the cluster client and the cluster's
// key names: the snapshot is written in its task's slot, then the hint is
// SPUBLISHed in its tenant's. If the hint fails, Publish returns an error
// and a retry of the same version announces it again.
func ExampleRedisPublisher_cluster() {
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{"10.0.0.1:6379", "10.0.0.2:6379", "10.0.0.3:6379"}})
	defer cc.Close()
	pub := fanout.NewRedisPublisher(cc, keys.Names{Cluster: true})

	s, err := snapshot.Parse([]byte(`{"task_id":"task_123","tenant_id":"t1","project_id":"p1",
		"user_id":"u1","status":"SUCCEEDED","progress":100,"version":19,"updated_at":1710000060000}`))
	if err != nil {
		log.Fatal(err)
	}
	for attempt := range 3 {
		if _, err = pub.Publish(context.Background(), s); err == nil {
			return
		}
		log.Printf("publish %s (attempt %d): %v", s.TaskID, attempt+1, err)
	}
}

// printer is a Handler that prints what a bus hears.
type printer struct{}

func (printer) Notify(n snapshot.Notification) {
	fmt.Println("changed:", n.TenantID, n.TaskID, n.Version)
}
func (printer) Resync(tenantID string) { fmt.Println("re-read the tasks of", tenantID) }

// A node on Redis Cluster hears its tenants' notifications through a
// ClusterBus, which takes the cluster client; on standalone Redis,
// NewRedisBus takes the same BusConfig with a *redis.Client. (No Output
// line: it needs a cluster.)
func ExampleNewClusterBus() {
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{"10.0.0.1:6379", "10.0.0.2:6379", "10.0.0.3:6379"}})
	defer cc.Close()
	bus := fanout.NewClusterBus(fanout.BusConfig{Client: cc, Names: keys.Names{Cluster: true}})
	bus.Start(printer{})
	defer bus.Close()

	release, err := bus.Subscribe(context.Background(), "t1")
	if err != nil {
		log.Fatal(err)
	}
	defer release() // the tenant stays subscribed for the Linger after the last release
}
