package testenv

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pushd/pushd/internal/rediscluster"
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
		s := &RedisServer{t: t, dir: t.TempDir(), port: port, args: rediscluster.NodeArgs()}
		s.Addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
		s.URL = "redis://" + s.Addr
		s.Start()
		t.Cleanup(s.Stop)
		c.Nodes = append(c.Nodes, s)
		addrs = append(addrs, s.Addr)
	}
	c.Seeds = strings.Join(addrs, ",")
	if err := rediscluster.Create(context.Background(), addrs); err != nil {
		t.Fatalf("testenv: %v", err)
	}
	c.WaitOK()
	return c
}

// clusterPort returns a free port whose cluster bus port (port + 10000) is
// free too.
func clusterPort(t testing.TB) int {
	t.Helper()
	p, err := rediscluster.FreePort()
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	return p
}

// WaitOK waits until the cluster has its number of masters among the
// running nodes and every running node reports cluster_state:ok with all
// 16384 slots served: after a master was killed, until its replica has
// taken over.
func (c *RedisCluster) WaitOK() {
	c.t.Helper()
	if err := rediscluster.WaitHealthy(context.Background(), c.running, c.masters, 30*time.Second); err != nil {
		c.t.Fatalf("testenv: %v", err)
	}
}

// running returns the addresses of the running nodes.
func (c *RedisCluster) running() []string {
	var out []string
	for _, s := range c.Nodes {
		if s.Running() {
			out = append(out, s.Addr)
		}
	}
	return out
}

// Masters returns the running nodes that serve slots.
func (c *RedisCluster) Masters() []*RedisServer {
	c.t.Helper()
	var out []*RedisServer
	for _, s := range c.Nodes {
		if !s.Running() {
			continue
		}
		if len(rediscluster.Masters(context.Background(), []string{s.Addr})) == 1 {
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

// MasterOf returns the address of the master serving key's slot, asking
// the cluster afresh.
func (c *RedisCluster) MasterOf(key string) string {
	c.t.Helper()
	cl := redis.NewClusterClient(&redis.ClusterOptions{Addrs: strings.Split(c.Seeds, ",")})
	defer cl.Close()
	m, err := cl.MasterForKey(context.Background(), key)
	if err != nil {
		c.t.Fatalf("testenv: master of %s: %v", key, err)
	}
	return m.Options().Addr
}

// MoveSlot migrates the slot of key, with its keys, to the master at to, as
// an operator does by hand: IMPORTING on the target, MIGRATING on the
// source, MIGRATE of every key, then SETSLOT NODE on every master. It
// returns the address of the master that served the slot before.
func (c *RedisCluster) MoveSlot(key, to string) (from string) {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	from = c.MasterOf(key)
	if from == to {
		c.t.Fatalf("testenv: %s is already served by %s", key, to)
	}
	src, dst := redis.NewClient(&redis.Options{Addr: from}), redis.NewClient(&redis.Options{Addr: to})
	defer src.Close()
	defer dst.Close()
	slot, err := src.ClusterKeySlot(ctx, key).Result()
	if err != nil {
		c.t.Fatalf("testenv: slot of %s: %v", key, err)
	}
	srcID, err1 := src.ClusterMyID(ctx).Result()
	dstID, err2 := dst.ClusterMyID(ctx).Result()
	if err := errors.Join(err1, err2); err != nil {
		c.t.Fatalf("testenv: node ids: %v", err)
	}
	must := func(what string, err error) {
		if err != nil {
			c.t.Fatalf("testenv: moving slot %d from %s to %s: %s: %v", slot, from, to, what, err)
		}
	}
	must("importing", dst.Do(ctx, "CLUSTER", "SETSLOT", slot, "IMPORTING", srcID).Err())
	must("migrating", src.Do(ctx, "CLUSTER", "SETSLOT", slot, "MIGRATING", dstID).Err())
	host, port, _ := net.SplitHostPort(to)
	for {
		ks, err := src.ClusterGetKeysInSlot(ctx, int(slot), 100).Result()
		must("getkeysinslot", err)
		if len(ks) == 0 {
			break
		}
		args := []any{"MIGRATE", host, port, "", 0, 5000, "KEYS"}
		for _, k := range ks {
			args = append(args, k)
		}
		must("migrate", src.Do(ctx, args...).Err())
	}
	// The target first, so the slot is never ownerless; then every master,
	// so none redirects to the old owner.
	must("node on target", dst.Do(ctx, "CLUSTER", "SETSLOT", slot, "NODE", dstID).Err())
	for _, m := range c.Masters() {
		if m.Addr == to {
			continue
		}
		cl := redis.NewClient(&redis.Options{Addr: m.Addr})
		err := cl.Do(ctx, "CLUSTER", "SETSLOT", slot, "NODE", dstID).Err()
		cl.Close()
		must("node on "+m.Addr, err)
	}
	return from
}

// ErrorCount returns how many error replies of the given kind (the first
// word of the error: CROSSSLOT, MOVED) the running nodes have sent since
// they started, from INFO errorstats.
func (c *RedisCluster) ErrorCount(kind string) int64 {
	c.t.Helper()
	var total int64
	for _, s := range c.Nodes {
		if !s.Running() {
			continue
		}
		cl := redis.NewClient(&redis.Options{Addr: s.Addr, MaxRetries: -1})
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		info, err := cl.Info(ctx, "errorstats").Result()
		cancel()
		cl.Close()
		if err != nil {
			c.t.Fatalf("testenv: INFO errorstats of %s: %v", s.Addr, err)
		}
		for line := range strings.Lines(info) {
			rest, ok := strings.CutPrefix(strings.TrimSpace(line), "errorstat_"+kind+":count=")
			if !ok {
				continue
			}
			n, err := strconv.ParseInt(rest, 10, 64)
			if err != nil {
				c.t.Fatalf("testenv: %s errorstats line %q: %v", s.Addr, line, err)
			}
			total += n
		}
	}
	return total
}

// WaitReplicated waits until every master's replica acknowledged what was
// written so far, so a master killed next loses nothing. A replica still in
// its first full sync acknowledges nothing, so WAIT is asked again (each
// call shorter than the client's 3 s read timeout) until one does.
func (c *RedisCluster) WaitReplicated() {
	c.t.Helper()
	cl := redis.NewClusterClient(&redis.ClusterOptions{Addrs: strings.Split(c.Seeds, ",")})
	defer cl.Close()
	ctx := context.Background()
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
		c.t.Fatalf("testenv: %v", err)
	}
}

// Spread picks perMaster candidates for each master: candidate(i) names the
// i-th one and key(id) the key whose slot decides its master. It returns the
// ids in the order picked and, by master address, the ids each one serves.
// One client answers every lookup.
func (c *RedisCluster) Spread(perMaster int, candidate func(i int) string, key func(id string) string) (ids []string, byMaster map[string][]string) {
	c.t.Helper()
	cl := redis.NewClusterClient(&redis.ClusterOptions{Addrs: strings.Split(c.Seeds, ",")})
	defer cl.Close()
	byMaster = make(map[string][]string)
	for i := 0; len(ids) < c.masters*perMaster; i++ {
		if i == 100*c.masters*perMaster {
			c.t.Fatalf("testenv: %d candidates did not spread %d per master over %d masters", i, perMaster, c.masters)
		}
		id := candidate(i)
		m, err := cl.MasterForKey(context.Background(), key(id))
		if err != nil {
			c.t.Fatalf("testenv: master of %s: %v", key(id), err)
		}
		if addr := m.Options().Addr; len(byMaster[addr]) < perMaster {
			byMaster[addr] = append(byMaster[addr], id)
			ids = append(ids, id)
		}
	}
	return ids, byMaster
}

// OtherMaster returns the address of a running master other than the one
// at addr.
func (c *RedisCluster) OtherMaster(addr string) string {
	c.t.Helper()
	for _, m := range c.Masters() {
		if m.Addr != addr {
			return m.Addr
		}
	}
	c.t.Fatalf("testenv: no master besides %s", addr)
	return ""
}

// Takeover promotes the replica of the master at addr with CLUSTER
// FAILOVER TAKEOVER, as an operator does to move a shard at once without
// the master's agreement, and waits until the cluster is ok with the
// replica as master and the old master as its replica. It returns the
// promoted replica's address.
func (c *RedisCluster) Takeover(addr string) (promoted string) {
	c.t.Helper()
	replica := c.ReplicaOf(addr)
	cl := redis.NewClient(&redis.Options{Addr: replica.Addr, MaxRetries: -1})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	err := cl.Do(ctx, "CLUSTER", "FAILOVER", "TAKEOVER").Err()
	cancel()
	cl.Close()
	if err != nil {
		c.t.Fatalf("testenv: CLUSTER FAILOVER TAKEOVER on %s: %v", replica.Addr, err)
	}
	promoted = replica.Addr
	deadline := time.Now().Add(30 * time.Second)
	for {
		c.WaitOK()
		ms := c.Masters()
		if slices.ContainsFunc(ms, func(m *RedisServer) bool { return m.Addr == promoted }) &&
			!slices.ContainsFunc(ms, func(m *RedisServer) bool { return m.Addr == addr }) {
			return promoted
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("testenv: %s not master in place of %s within 30s", promoted, addr)
		}
		time.Sleep(50 * time.Millisecond) // the nodes converge on their own; nothing to wait on
	}
}

// ReplicaOf returns the running replica of the master at addr.
func (c *RedisCluster) ReplicaOf(addr string) *RedisServer {
	c.t.Helper()
	host, port, _ := net.SplitHostPort(addr)
	for _, s := range c.Nodes {
		if !s.Running() || s.Addr == addr {
			continue
		}
		if role, err := rediscluster.Role(context.Background(), s.Addr); err == nil && len(role) >= 3 && role[0] == "slave" && fmt.Sprint(role[1]) == host && fmt.Sprint(role[2]) == port {
			return s
		}
	}
	c.t.Fatalf("testenv: no running replica of %s", addr)
	return nil
}

// ConfigSet sets a parameter on every running node (CONFIG SET).
func (c *RedisCluster) ConfigSet(param, value string) {
	c.t.Helper()
	for _, s := range c.Nodes {
		if s.Running() {
			configSet(c.t, s.Addr, param, value)
		}
	}
}

// ConfigSet sets a parameter on the server (CONFIG SET).
func (s *RedisServer) ConfigSet(param, value string) {
	s.t.Helper()
	configSet(s.t, s.Addr, param, value)
}

func configSet(t testing.TB, addr, param, value string) {
	t.Helper()
	cl := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := cl.ConfigSet(ctx, param, value).Err(); err != nil {
		t.Fatalf("testenv: CONFIG SET %s %s on %s: %v", param, value, addr, err)
	}
}
