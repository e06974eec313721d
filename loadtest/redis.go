package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pushd/pushd/internal/rediscluster"
	"github.com/pushd/pushd/keys"
)

// redisDeployment is the run's private Redis: one redis-server, or a Redis
// Cluster of three masters with a replica each.
type redisDeployment interface {
	// url is what pushd's --redis-url takes.
	url() string
	// client is the publisher's client, with publishers connections per
	// node: a *redis.Client or a *redis.ClusterClient.
	client(publishers int) redis.UniversalClient
	// names spells the keys as pushd does on this deployment.
	names() keys.Names
	// pids are the running redis-server processes.
	pids() []int
	// ports are the ports its servers listen on.
	ports() []int
	kill()
}

func (r *redisServer) names() keys.Names { return keys.Names{} }

func (r *redisServer) client(publishers int) redis.UniversalClient {
	return redis.NewClient(&redis.Options{Addr: r.addr(), PoolSize: publishers + 8, MaxRetries: -1,
		DialTimeout: 500 * time.Millisecond, ReadTimeout: 2 * time.Second, WriteTimeout: 2 * time.Second})
}

func (r *redisServer) pids() []int {
	if r.proc == nil || r.proc.exited() {
		return nil
	}
	return []int{r.proc.pid()}
}

func (r *redisServer) ports() []int { return []int{r.port} }

func (r *redisServer) kill() { r.proc.kill() }

// clusterMasters is the number of masters of the loadtest's cluster, each
// with one replica, and of the pushd nodes beside it.
const clusterMasters = 3

// redisCluster is a private Redis Cluster made by rediscluster: no
// persistence, so a node that restarts comes back empty.
type redisCluster struct {
	nodes []*redisServer
}

// startRedisCluster starts six nodes on free ports, each in a directory of
// its own under dir, joins them and waits until every slot is served.
func startRedisCluster(ctx context.Context, bin, dir string) (*redisCluster, error) {
	c := &redisCluster{}
	for i := range 2 * clusterMasters {
		port, err := rediscluster.FreePort()
		if err != nil {
			c.kill()
			return nil, err
		}
		ndir := filepath.Join(dir, "redis"+strconv.Itoa(i))
		if err := os.MkdirAll(ndir, 0o755); err != nil {
			c.kill()
			return nil, err
		}
		n := &redisServer{bin: bin, dir: ndir, port: port, args: rediscluster.NodeArgs()}
		c.nodes = append(c.nodes, n)
		if err := n.start(ctx); err != nil {
			c.kill()
			return nil, fmt.Errorf("cluster node %d: %w", i, err)
		}
	}
	if err := rediscluster.Create(ctx, c.running()); err != nil {
		c.kill()
		return nil, err
	}
	if err := c.waitOK(ctx); err != nil {
		c.kill()
		return nil, err
	}
	return c, nil
}

// running returns the addresses of the nodes still running.
func (c *redisCluster) running() []string {
	var out []string
	for _, n := range c.nodes {
		if n.proc != nil && !n.proc.exited() {
			out = append(out, n.addr())
		}
	}
	return out
}

// waitOK waits until the running nodes count three masters and all agree
// the cluster serves every slot: after a master was killed, until its
// replica took over.
func (c *redisCluster) waitOK(ctx context.Context) error {
	return rediscluster.WaitHealthy(ctx, c.running, clusterMasters, 30*time.Second)
}

func (c *redisCluster) url() string { return strings.Join(c.running(), ",") }

func (c *redisCluster) names() keys.Names { return keys.Names{Cluster: true} }

func (c *redisCluster) client(publishers int) redis.UniversalClient {
	// One dial and no pause between go-redis's attempts, as pushd's own
	// cluster client: against a dead master go-redis would otherwise dial
	// five times 100 ms apart and back off up to 1 s between attempts, and
	// a publisher goroutine waiting holds up the other tasks it owns, which
	// would then look hit by the kill. A write that fails is sent again by
	// the publisher (retryFailed).
	return redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.running(), PoolSize: publishers + 8, MaxRetries: -1,
		DialerRetries: 1, MinRetryBackoff: -1, MaxRetryBackoff: -1,
		DialTimeout: 500 * time.Millisecond, ReadTimeout: 2 * time.Second, WriteTimeout: 2 * time.Second})
}

func (c *redisCluster) pids() []int {
	var out []int
	for _, n := range c.nodes {
		out = append(out, n.pids()...)
	}
	return out
}

func (c *redisCluster) ports() []int {
	var out []int
	for _, n := range c.nodes {
		out = append(out, n.port)
	}
	return out
}

func (c *redisCluster) kill() {
	for _, n := range c.nodes {
		if n.proc != nil {
			n.proc.kill()
		}
	}
}

// node returns the node listening on addr.
func (c *redisCluster) node(addr string) *redisServer {
	for _, n := range c.nodes {
		if n.addr() == addr {
			return n
		}
	}
	return nil
}

// flushAll empties Redis: on a cluster, every master.
func flushAll(ctx context.Context, rdb redis.UniversalClient) error {
	if cc, ok := rdb.(*redis.ClusterClient); ok {
		return cc.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
			return m.FlushAll(ctx).Err()
		})
	}
	return rdb.FlushAll(ctx).Err()
}

// usedMemory is Redis's used_memory (INFO memory) in bytes: on a cluster,
// the masters' sum (each replica holds as much again).
func usedMemory(ctx context.Context, rdb redis.UniversalClient) (int64, error) {
	one := func(ctx context.Context, c *redis.Client) (int64, error) {
		info, err := c.Info(ctx, "memory").Result()
		if err != nil {
			return 0, err
		}
		for line := range strings.SplitSeq(info, "\n") {
			if v, ok := strings.CutPrefix(strings.TrimSpace(line), "used_memory:"); ok {
				return strconv.ParseInt(v, 10, 64)
			}
		}
		return 0, fmt.Errorf("INFO memory has no used_memory")
	}
	switch c := rdb.(type) {
	case *redis.Client:
		return one(ctx, c)
	case *redis.ClusterClient:
		var mu sync.Mutex
		var total int64
		err := c.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
			n, err := one(ctx, m)
			mu.Lock()
			total += n
			mu.Unlock()
			return err
		})
		return total, err
	}
	return 0, fmt.Errorf("no Redis to read")
}

// keyMemory is what a Redis's keys take (MEMORY USAGE, key and value with
// their overhead), by class: Task is the task keys (snapshots and their
// bookkeeping, which expire with their task's status, whoever watches
// it), Conn the connections' (conn: leases and counts, rl: connect
// buckets), Other the rest.
type keyMemory struct {
	Task, Conn, Other int64
}

// keysMemory scans every key of rdb (on a cluster, of every master) and
// adds up what each class takes.
func keysMemory(ctx context.Context, rdb redis.UniversalClient, prefix string) (keyMemory, error) {
	var mu sync.Mutex
	var total keyMemory
	one := func(ctx context.Context, c *redis.Client) error {
		var cursor uint64
		for {
			keys, next, err := c.Scan(ctx, cursor, "", 1000).Result()
			if err != nil {
				return err
			}
			pipe := c.Pipeline()
			cmds := make([]*redis.IntCmd, len(keys))
			for i, k := range keys {
				cmds[i] = pipe.MemoryUsage(ctx, k)
			}
			if len(keys) > 0 {
				pipe.Exec(ctx) // a key that expired meanwhile answers nil: not counted
			}
			var km keyMemory
			for i, k := range keys {
				n, err := cmds[i].Result()
				if err != nil {
					continue
				}
				switch k = strings.TrimPrefix(k, prefix); {
				case strings.HasPrefix(k, "task:"):
					km.Task += n
				case strings.HasPrefix(k, "conn:"), strings.HasPrefix(k, "rl:"):
					km.Conn += n
				default:
					km.Other += n
				}
			}
			mu.Lock()
			total.Task, total.Conn, total.Other = total.Task+km.Task, total.Conn+km.Conn, total.Other+km.Other
			mu.Unlock()
			if cursor = next; cursor == 0 {
				return nil
			}
		}
	}
	switch c := rdb.(type) {
	case *redis.Client:
		return total, one(ctx, c)
	case *redis.ClusterClient:
		err := c.ForEachMaster(ctx, one)
		return total, err
	}
	return total, fmt.Errorf("no Redis to read")
}
