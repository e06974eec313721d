package testenv

import (
	"context"
	"fmt"
	"net"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// RedisCluster is a private Redis Cluster owned by one test: masters with
// one replica each, made by redis-server and redis-cli --cluster create, as
// an operator would make it. Kill a master with its Stop to test failover.
type RedisCluster struct {
	Nodes []*RedisServer
	// Seeds are the nodes' addresses, comma-separated: what --redis-url
	// takes in cluster mode.
	Seeds string

	t       testing.TB
	masters int
}

// clusterNodeTimeout is how long a master may be silent before its replica
// takes over: short, so failover tests are quick.
const clusterNodeTimeout = 1000 * time.Millisecond

// StartRedisCluster starts masters masters with one replica each and waits
// until every slot is served and every node agrees the cluster is ok.
func StartRedisCluster(t testing.TB, masters int) *RedisCluster {
	t.Helper()
	if _, err := exec.LookPath("redis-cli"); err != nil {
		t.Fatalf("testenv: redis-cli not found on PATH (install Debian's redis-tools, or run scripts/test): %v", err)
	}
	c := &RedisCluster{t: t, masters: masters}
	addrs := make([]string, 0, 2*masters)
	for range 2 * masters {
		port := clusterPort(t)
		s := &RedisServer{t: t, dir: t.TempDir(), port: port, args: []string{
			"--cluster-enabled", "yes",
			"--cluster-config-file", "nodes.conf",
			"--cluster-node-timeout", strconv.Itoa(int(clusterNodeTimeout / time.Millisecond)),
		}}
		s.Addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
		s.URL = "redis://" + s.Addr
		s.Start()
		t.Cleanup(s.Stop)
		c.Nodes = append(c.Nodes, s)
		addrs = append(addrs, s.Addr)
	}
	c.Seeds = strings.Join(addrs, ",")
	args := append([]string{"--cluster", "create"}, addrs...)
	args = append(args, "--cluster-replicas", "1", "--cluster-yes")
	if out, err := exec.Command("redis-cli", args...).CombinedOutput(); err != nil {
		t.Fatalf("testenv: redis-cli --cluster create: %v\n%s", err, out)
	}
	c.WaitOK()
	return c
}

// clusterPort returns a free port whose cluster bus port (port + 10000) is
// free too.
func clusterPort(t testing.TB) int {
	t.Helper()
	for range 100 {
		p := FreePort(t)
		if p+10000 > 65535 {
			continue
		}
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p+10000)))
		if err != nil {
			continue
		}
		l.Close()
		return p
	}
	t.Fatal("testenv: no free port pair for a cluster node")
	return 0
}

// WaitOK waits until the cluster has its number of masters among the
// running nodes and every running node reports cluster_state:ok with all
// 16384 slots served: after a master was killed, until its replica has
// taken over.
func (c *RedisCluster) WaitOK() {
	c.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		bad := c.notOK()
		if n := len(c.Masters()); bad == "" && n != c.masters {
			bad = fmt.Sprintf("%d masters running, want %d", n, c.masters)
		}
		if bad == "" {
			return
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("testenv: cluster not ok within 30s: %s", bad)
		}
		time.Sleep(50 * time.Millisecond) // polling servers that converge on their own; nothing to wait on
	}
}

// notOK says which running node does not see a healthy cluster, or "".
func (c *RedisCluster) notOK() string {
	for _, s := range c.Nodes {
		if !s.Running() {
			continue
		}
		cl := redis.NewClient(&redis.Options{Addr: s.Addr, MaxRetries: -1})
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		info, err := cl.ClusterInfo(ctx).Result()
		cancel()
		cl.Close()
		if err != nil {
			return fmt.Sprintf("%s: %v", s.Addr, err)
		}
		if !strings.Contains(info, "cluster_state:ok") || !strings.Contains(info, "cluster_slots_ok:16384") {
			return s.Addr + ": " + strings.Join(strings.Fields(info)[:4], " ")
		}
	}
	return ""
}

// Masters returns the running nodes that serve slots.
func (c *RedisCluster) Masters() []*RedisServer {
	c.t.Helper()
	var out []*RedisServer
	for _, s := range c.Nodes {
		if !s.Running() {
			continue
		}
		cl := redis.NewClient(&redis.Options{Addr: s.Addr, MaxRetries: -1})
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		role, err := cl.Do(ctx, "ROLE").Slice()
		cancel()
		cl.Close()
		if err == nil && len(role) > 0 && role[0] == "master" {
			out = append(out, s)
		}
	}
	return out
}

// Client returns a cluster client over the seeds, closed when the test ends.
func (c *RedisCluster) Client() *redis.ClusterClient {
	cl := redis.NewClusterClient(&redis.ClusterOptions{Addrs: strings.Split(c.Seeds, ",")})
	c.t.Cleanup(func() { cl.Close() })
	return cl
}
