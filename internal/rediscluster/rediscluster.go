// Package rediscluster makes a private Redis Cluster out of redis-server
// processes, as an operator would with redis-cli --cluster create, and says
// when it is healthy. The test suite (internal/testenv) and the loadtest
// both build their clusters with it; each starts and owns the processes
// itself.
package rediscluster

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// NodeTimeout is how long a master may be silent before its replica takes
// over: short, so failover is quick to test and to measure.
const NodeTimeout = 1000 * time.Millisecond

// NodeArgs are the redis-server arguments, besides the port and the
// directory, of a node of a cluster whose nodes.conf lives in the node's
// directory.
func NodeArgs() []string {
	return []string{
		"--cluster-enabled", "yes",
		"--cluster-config-file", "nodes.conf",
		"--cluster-node-timeout", strconv.Itoa(int(NodeTimeout / time.Millisecond)),
		// A replica takes over however long ago it last heard its master:
		// the master may die before the replica's first sync has aged.
		"--cluster-replica-validity-factor", "0",
	}
}

// FreePort returns a port of 127.0.0.1 that was free a moment ago, and
// whose cluster bus port (port + 10000) was free too.
func FreePort() (int, error) {
	for range 100 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return 0, fmt.Errorf("free port: %w", err)
		}
		p := l.Addr().(*net.TCPAddr).Port
		l.Close()
		if p+10000 > 65535 {
			continue
		}
		bus, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p+10000)))
		if err != nil {
			continue
		}
		bus.Close()
		return p, nil
	}
	return 0, errors.New("no free port pair for a cluster node")
}

// Create joins the running nodes at addrs into one cluster with one replica
// per master (redis-cli --cluster create): len(addrs)/2 masters.
func Create(ctx context.Context, addrs []string) error {
	if _, err := exec.LookPath("redis-cli"); err != nil {
		return fmt.Errorf("redis-cli not found on PATH (Debian's redis-tools): %w", err)
	}
	args := append([]string{"--cluster", "create"}, addrs...)
	args = append(args, "--cluster-replicas", "1", "--cluster-yes")
	if out, err := exec.CommandContext(ctx, "redis-cli", args...).CombinedOutput(); err != nil {
		return fmt.Errorf("redis-cli --cluster create: %w\n%s", err, out)
	}
	return nil
}

// WaitHealthy waits until the nodes running() names include masters masters
// and every one of them reports cluster_state:ok with all 16384 slots
// served: after a master was killed, until its replica has taken over.
func WaitHealthy(ctx context.Context, running func() []string, masters int, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		addrs := running()
		bad := unhealthy(ctx, addrs)
		if n := len(Masters(ctx, addrs)); bad == "" && n != masters {
			bad = fmt.Sprintf("%d masters running, want %d", n, masters)
		}
		if bad == "" {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("cluster not ok within %v: %s", timeout, bad)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond): // polling servers that converge on their own; nothing to wait on
		}
	}
}

// unhealthy says which node of addrs does not see a healthy cluster, or "".
func unhealthy(ctx context.Context, addrs []string) string {
	for _, addr := range addrs {
		cl := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
		cctx, cancel := context.WithTimeout(ctx, time.Second)
		info, err := cl.ClusterInfo(cctx).Result()
		cancel()
		cl.Close()
		if err != nil {
			return fmt.Sprintf("%s: %v", addr, err)
		}
		if !strings.Contains(info, "cluster_state:ok") || !strings.Contains(info, "cluster_slots_ok:16384") {
			return addr + ": " + strings.Join(strings.Fields(info)[:4], " ")
		}
	}
	return ""
}

// Masters returns the nodes of addrs that serve slots.
func Masters(ctx context.Context, addrs []string) []string {
	var out []string
	for _, addr := range addrs {
		if role, err := Role(ctx, addr); err == nil && len(role) > 0 && role[0] == "master" {
			out = append(out, addr)
		}
	}
	return out
}

// Role is the ROLE reply of the node at addr: "master" first, or "slave",
// its master's host and port.
func Role(ctx context.Context, addr string) ([]any, error) {
	cl := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
	defer cl.Close()
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	return cl.Do(ctx, "ROLE").Slice()
}
