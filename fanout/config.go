package fanout

import (
	"log/slog"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pushd/pushd/keys"
)

// BusConfig configures a Redis bus: a RedisBus (NewRedisBus) on standalone
// Redis, or a ClusterBus (NewClusterBus) on Redis Cluster. Only Client is
// required. A field only one of the buses reads says which.
type BusConfig struct {
	// Client is the node's client of the realtime Redis. Required.
	//
	// RedisBus opens its one Pub/Sub connection on it and PUBLISHes its
	// liveness messages through it: a *redis.Client, or a
	// *redis.ClusterClient (classic Pub/Sub, which a cluster broadcasts to
	// every node). A *redis.Ring cannot open a Pub/Sub connection without a
	// channel and is refused.
	//
	// ClusterBus needs a *redis.ClusterClient, and refuses anything else:
	// it asks the client which master owns a channel's slot, reloads its
	// slot map when a slot moved, and SPUBLISHes liveness messages straight
	// to each master through the client's own client of that master.
	Client redis.UniversalClient
	// Names spells the tenant and liveness channels. The zero value uses
	// the names of docs/DESIGN.md, "Key names".
	Names keys.Names
	// Linger is how long an unreferenced tenant stays subscribed, so a
	// browser that reconnects costs no unsubscribe and subscribe. Zero
	// means 2s.
	Linger time.Duration
	// PingInterval is how long a Pub/Sub connection (RedisBus's one, each
	// of ClusterBus's shards) may stay silent before the bus pings it. A
	// ping still unanswered one interval later means the connection is
	// dead: it is replaced. That needs the client's write deadlines (any
	// WriteTimeout but -2). Zero means 5s.
	PingInterval time.Duration
	// CheckInterval, read by ClusterBus only, is how often the bus reloads
	// the slot map and moves a tenant whose slot changed master without
	// the bus being told (a master that lost its slots usually says so
	// with sunsubscribe, and a dead one drops its connections). Zero means
	// 5s.
	CheckInterval time.Duration
	// LivenessInterval is how often the bus publishes a message to itself
	// and expects to hear it back on its subscription: that proves the
	// subscription delivers, where a ping only proves the connection
	// answers. RedisBus PUBLISHes on a channel of its own
	// (keys.Names.Liveness) through Client, the normal command path.
	// ClusterBus SPUBLISHes straight to each shard's master on that shard's
	// channel (keys.Names.ShardLiveness, the same on every node; each bus
	// hears back only messages that carry its own id). Zero means 1s;
	// negative disables the liveness check.
	LivenessInterval time.Duration
	// LivenessTimeout is how long a subscription (RedisBus's connection, a
	// ClusterBus shard) may go without hearing back its liveness message
	// before the bus declares it dead, replaces its connection and reports
	// Lost; the new connection subscribes everything again. The clock
	// starts when Redis acknowledges a liveness publish, so failing
	// publishes (the command path down or saturated) never condemn a
	// subscription that may be fine. Zero means 3 × LivenessInterval.
	LivenessTimeout time.Duration
	// Logger receives the bus's logs. Nil means slog.Default().
	Logger *slog.Logger
}

func (c BusConfig) withDefaults() BusConfig {
	if c.Linger <= 0 {
		c.Linger = 2 * time.Second
	}
	if c.PingInterval <= 0 {
		c.PingInterval = 5 * time.Second
	}
	if c.CheckInterval <= 0 {
		c.CheckInterval = 5 * time.Second
	}
	if c.LivenessInterval == 0 {
		c.LivenessInterval = time.Second
	}
	if c.LivenessInterval > 0 && c.LivenessTimeout <= 0 {
		c.LivenessTimeout = 3 * c.LivenessInterval
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}
