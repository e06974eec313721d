package node

import (
	"cmp"
	"context"
	"fmt"

	"github.com/redis/go-redis/v9"

	"github.com/pushd/pushd/fanout"
	"github.com/pushd/pushd/keys"
)

// newStandalone is standalone Redis, with PostgreSQL behind it when
// configured: one client per distinct URL among the cache, control and
// realtime roles, Pub/Sub on the realtime one.
func newStandalone(ctx context.Context, cfg Config, t TestTuning) (*backend, error) {
	b := &backend{attrs: []any{"redis_cluster", false}}
	clients := map[string]*redis.Client{}
	dial := func(role, url string) (*redis.Client, error) {
		if c, ok := clients[url]; ok {
			return c, nil
		}
		opt, err := redis.ParseURL(url)
		if err != nil {
			return nil, fmt.Errorf("redis %s url: %w", role, err)
		}
		// Fail fast while Redis is down: the store falls back to
		// PostgreSQL, the hub to polling and admission to local limits, so a
		// retried dial only delays them. Our contexts bound every call (the
		// store gives Redis a share of its fetch timeout, admission its own
		// timeout), which go-redis honours only when told to.
		opt.DialerRetries = 1
		opt.ContextTimeoutEnabled = true
		opt.ReadBufferSize = cmp.Or(opt.ReadBufferSize, redisBufferSize)
		opt.WriteBufferSize = cmp.Or(opt.WriteBufferSize, redisBufferSize)
		opt.PipelineReadBufferSize = cmp.Or(opt.PipelineReadBufferSize, redisPipelineBufferSize)
		opt.PipelineWriteBufferSize = cmp.Or(opt.PipelineWriteBufferSize, redisPipelineBufferSize)
		c := redis.NewClient(opt)
		clients[url] = c
		b.onClose(func() { c.Close() })
		return c, nil
	}
	var r redisRoles
	realtime, err := dial("realtime", cmp.Or(cfg.RedisRealtimeURL, cfg.RedisURL))
	if err == nil {
		r.realtime = realtime
		r.cache, err = dial("cache", cmp.Or(cfg.RedisCacheURL, cfg.RedisURL))
	}
	if err == nil {
		r.control, err = dial("control", cmp.Or(cfg.RedisControlURL, cfg.RedisURL))
	}
	if err != nil {
		b.close()
		return nil, err
	}
	names := keys.Names{Prefix: cfg.KeyPrefix}
	bus := fanout.NewRedisBus(fanout.BusConfig{Client: realtime, Names: names, LivenessInterval: t.LivenessInterval, Logger: cfg.Logger})
	m := redisMode{roles: r, names: names, bus: bus, publisher: standalonePublisher(r, names, publisherOptions(cfg)...)}
	if err := b.finishRedis(ctx, cfg, t, m); err != nil {
		b.close()
		return nil, err
	}
	return b, nil
}

// standalonePublisher is POST /v1/publish's: one script on one Redis when
// the cache and realtime roles share it, else the three steps of a
// fanout.NewSplitRedisPublisher: journal on the realtime Redis, snapshot on
// the cache Redis, then the announcement on the realtime one, which the
// node's reconcile repeats for a publish that died before it.
func standalonePublisher(r redisRoles, names keys.Names, opts ...fanout.PublisherOption) *fanout.RedisPublisher {
	if r.cache == r.realtime {
		return fanout.NewRedisPublisher(r.realtime, names, opts...)
	}
	return fanout.NewSplitRedisPublisher(r.cache, r.realtime, names, opts...)
}
