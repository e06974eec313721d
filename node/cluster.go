package node

import (
	"cmp"
	"context"
	"fmt"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"

	"github.com/pushd/pushd/fanout"
	"github.com/pushd/pushd/internal/redisx"
	"github.com/pushd/pushd/keys"
)

// newCluster puts every role on one Redis Cluster: sharded Pub/Sub, and
// task keys hash-tagged by task id.
func newCluster(ctx context.Context, cfg Config, t TestTuning) (*backend, error) {
	opt, err := redisx.ParseClusterURL(cfg.RedisURL)
	if err != nil {
		return nil, fmt.Errorf("redis cluster url: %w", err)
	}
	// As the standalone clients: fail fast, and honour our contexts. A
	// dialer_retries option in the URL is left as it is.
	if opt.DialerRetries == 0 {
		opt.DialerRetries = 1
	}
	opt.ContextTimeoutEnabled = true
	// No maintenance notifications (a hosted Redis's upgrade hints), as on
	// the bus's shard clients: go-redis would start a cleanup goroutine for
	// every master's client it makes on first use, kept until Close.
	opt.MaintNotificationsConfig = &maintnotifications.Config{Mode: maintnotifications.ModeDisabled}
	// The cluster client makes no pipeline pool unless its buffer sizes are
	// set, so only the regular connections' buffers are made smaller.
	opt.ReadBufferSize = cmp.Or(opt.ReadBufferSize, redisBufferSize)
	opt.WriteBufferSize = cmp.Or(opt.WriteBufferSize, redisBufferSize)
	cluster := redis.NewClusterClient(opt)
	b := &backend{attrs: []any{"redis_cluster", true}}
	b.onClose(func() { cluster.Close() })
	names := keys.Names{Prefix: cfg.KeyPrefix, Cluster: true}
	bus := fanout.NewClusterBus(fanout.BusConfig{Client: cluster, Names: names, LivenessInterval: t.LivenessInterval, Logger: cfg.Logger})
	r := redisRoles{cache: cluster, control: cluster, realtime: cluster}
	m := redisMode{roles: r, names: names, bus: bus, publisher: fanout.NewRedisPublisher(cluster, names, publisherOptions(cfg)...)}
	if err := b.finishRedis(ctx, cfg, t, m); err != nil {
		b.close()
		return nil, err
	}
	return b, nil
}
