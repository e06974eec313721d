package node

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/redis/go-redis/v9"

	"github.com/pushd/pushd/fanout"
	"github.com/pushd/pushd/fanout/rediswrite"
	"github.com/pushd/pushd/internal/redisx"
	"github.com/pushd/pushd/keys"
	"github.com/pushd/pushd/snapshot"
)

func roleURL(role, def string) string {
	if role != "" {
		return role
	}
	return def
}

// dialRoles makes the node's Redis clients: one per distinct URL among the
// cache, control and realtime roles.
func (n *Node) dialRoles() error {
	cfg := n.cfg
	if cfg.RedisURL == "" {
		return errors.New("the Redis role URLs need a Redis URL")
	}
	if cfg.RedisCluster {
		return n.dialCluster()
	}
	n.clients = make(map[string]*redis.Client)
	var err error
	if n.rdb, err = n.dial("realtime", roleURL(cfg.RedisRealtimeURL, cfg.RedisURL)); err != nil {
		return err
	}
	n.realtime = n.rdb
	if n.cache, err = n.dial("cache", roleURL(cfg.RedisCacheURL, cfg.RedisURL)); err != nil {
		return err
	}
	if n.control, err = n.dial("control", roleURL(cfg.RedisControlURL, cfg.RedisURL)); err != nil {
		return err
	}
	if cfg.Streams && n.cache != n.rdb {
		// POST /v1/publish appends to the stream in the script that writes
		// the snapshot; across two servers that step cannot be atomic.
		return errors.New("streams need the cache and realtime roles on one Redis")
	}
	return nil
}

// dialCluster puts every role on one Redis Cluster.
func (n *Node) dialCluster() error {
	cfg := n.cfg
	switch {
	case cfg.RedisCacheURL != "" || cfg.RedisControlURL != "" || cfg.RedisRealtimeURL != "":
		return errors.New("the Redis role URLs are for standalone Redis; a cluster serves every role")
	}
	opt, err := redisx.ParseClusterURL(cfg.RedisURL)
	if err != nil {
		return fmt.Errorf("redis cluster url: %w", err)
	}
	// As the standalone clients (dial): fail fast, and honour our contexts.
	// A dialer_retries option in the URL is left as it is.
	if opt.DialerRetries == 0 {
		opt.DialerRetries = 1
	}
	opt.ContextTimeoutEnabled = true
	n.cluster = redis.NewClusterClient(opt)
	n.realtime, n.cache, n.control = n.cluster, n.cluster, n.cluster
	return nil
}

func (n *Node) dial(role, url string) (*redis.Client, error) {
	if c, ok := n.clients[url]; ok {
		return c, nil
	}
	opt, err := redis.ParseURL(url)
	if err != nil {
		return nil, fmt.Errorf("redis %s url: %w", role, err)
	}
	// Fail fast while Redis is down: the store falls back to PostgreSQL,
	// the hub to polling and admission to local limits, so a retried dial
	// only delays them. Our contexts bound every call (the store gives Redis
	// a share of its fetch timeout, admission its own timeout), which
	// go-redis honours only when told to.
	opt.DialerRetries = 1
	opt.ContextTimeoutEnabled = true
	c := redis.NewClient(opt)
	n.clients[url] = c
	return c, nil
}

// publisher is POST /v1/publish's: one script on one Redis when the cache
// and realtime roles share it, else the snapshot written to the cache and,
// when it was newer, its notification published on the realtime Redis.
func (n *Node) publisher(names keys.Names) fanout.Publisher {
	if n.cache == n.realtime {
		return fanout.NewRedisPublisher(n.realtime, names)
	}
	return &splitPublisher{cache: n.cache, realtime: n.realtime, names: names}
}

type splitPublisher struct {
	cache, realtime redis.UniversalClient
	names           keys.Names
}

func (p *splitPublisher) Publish(ctx context.Context, s *snapshot.Snapshot) (bool, error) {
	if s == nil {
		return false, errors.New("publish: nil snapshot")
	}
	written, err := rediswrite.Write(ctx, p.cache, p.names, s, 0, "", nil)
	if err != nil || !written {
		return false, err
	}
	msg, err := json.Marshal(snapshot.NotificationFor(s))
	if err != nil {
		return true, fmt.Errorf("publish %s: %w", s.TaskID, err)
	}
	// The snapshot is stored; a lost notification is a gap the liveness
	// check and polling close, as for any Pub/Sub loss.
	if err := p.realtime.Publish(ctx, p.names.Channel(s.TenantID), msg).Err(); err != nil {
		return true, fmt.Errorf("publish %s: %w", s.TaskID, err)
	}
	return true, nil
}
