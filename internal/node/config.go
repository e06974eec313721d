package node

import (
	"cmp"
	"log/slog"
	"net"
	"strings"
	"time"

	"github.com/pushd/pushd/admission"
	"github.com/pushd/pushd/auth/session"
)

// Config is a node's settings: what an operator sets, through cmd/pushd's
// flags. With neither RedisURL nor DatabaseURL the node runs embedded: one
// node, an in-memory bus and store. What only tests change is an Option.
type Config struct {
	RedisURL string
	// RedisCluster makes RedisURL the comma-separated seed nodes of a Redis
	// Cluster (redisx.ParseClusterURL: the first seed carries credentials,
	// TLS and client options), which then serves every role: sharded
	// Pub/Sub, and task keys hash-tagged by task id (keys.Names.Cluster).
	RedisCluster bool
	// RedisCacheURL (snapshots), RedisControlURL (limits, leases, sessions)
	// and RedisRealtimeURL (Pub/Sub, streams) put each role on a Redis of
	// its own; each empty means RedisURL, which they need.
	RedisCacheURL    string
	RedisControlURL  string
	RedisRealtimeURL string
	KeyPrefix        string // prefix of every Redis key and channel
	DatabaseURL      string // needs RedisURL

	JWTSecret       []byte
	JWTPublicKeyPEM []byte
	JWTAlgorithm    string
	// JWTAudience, JWTIssuer and JWTMaxTTL restrict the JWTs taken (see
	// auth.Config); empty or zero checks nothing.
	JWTAudience []string
	JWTIssuer   string
	JWTMaxTTL   time.Duration
	APIKey      string

	NodeName       string
	Version        string // the build's version, shown by GET /
	OriginPatterns []string
	// TrustedProxies are the load balancers whose X-Forwarded-For names
	// the client for the per-address limits; empty means the TCP peer.
	TrustedProxies []*net.IPNet
	// AuthFailureBurst and AuthFailureRate limit failed authentications
	// per client address, tracked for up to AuthFailureAddresses addresses
	// (see api.Config); either of the first two zero means no limit.
	AuthFailureBurst     int
	AuthFailureRate      float64
	AuthFailureAddresses int

	Heartbeat    time.Duration // zero: the hub's default
	PollInterval time.Duration // polling mode's re-read interval; zero: the hub's default (2s)
	WriteTimeout time.Duration // zero: the transports' default
	// Writers is the size of the hub's pool of writers; zero: the hub's
	// default (32). They never wait for a client, so it bounds CPU, not
	// how many slow clients the node tolerates.
	Writers int
	// Per-connection limits; each zero means the default in brackets.
	// MaxSubscriptions: tasks plus projects one connection watches (200).
	// MaxIDs: tasks plus projects of one request, an SSE URL or a
	// WebSocket subscribe (100). SubscribeTimeout: the initial reads of
	// one subscription (10s). WSMaxMessageBytes: one WebSocket message
	// from a client, closed with 1009 past it (64 KiB). WSRequestRate and
	// WSRequestBurst: a WebSocket's requests, a token bucket (10/s, 20).
	// WSMaxBadMessages: malformed or over-rate requests in a row before
	// 1008 (10). WSControlFrames: pings and pongs a WebSocket client may
	// send per second, bursts of twice that, 1008 past it (5). FirstRequestTimeout: how long a WebSocket may wait before
	// its first request (10s).
	MaxSubscriptions    int
	MaxIDs              int
	SubscribeTimeout    time.Duration
	WSMaxMessageBytes   int64
	WSRequestRate       float64
	WSRequestBurst      int
	WSMaxBadMessages    int
	WSControlFrames     float64
	FirstRequestTimeout time.Duration
	// SubscribeReads and SubscribeReadBurst are each user's budget, on
	// this node, of snapshot reads that subscriptions cause (50/s, bursts
	// of 500); ids past it are refused with rate_limit_exceeded.
	SubscribeReads     float64
	SubscribeReadBurst int
	// SendBuffer is each stream's socket send buffer (SO_SNDBUF), bounding
	// what the kernel holds for a client that stopped reading; zero leaves
	// the kernel's autotuning (up to 4 MB a socket on Linux).
	SendBuffer int
	// HotTaskWatchers is the number of connections on this node watching
	// one task by id that makes it hot (hot_key_detected_total); zero: the
	// hub's default (1000).
	HotTaskWatchers int

	SSERetry time.Duration // zero: the SSE default
	// ReconnectAfter bounds the random delay draining clients wait before
	// reconnecting; zero means 5s.
	ReconnectAfter time.Duration
	// MaxConns and MaxConnsPerIP bound the streams this node holds, in all
	// (503 past it) and per client address (429); zero means no limit.
	MaxConns      int
	MaxConnsPerIP int
	// RequestTimeout bounds how long a request, headers and body, may take
	// to arrive; zero means 10s. Streams are not bounded by it once they
	// are established.
	RequestTimeout time.Duration
	// MaxHeaderBytes bounds a request's line and headers (431 past it);
	// zero means 64 KiB.
	MaxHeaderBytes int
	// MaxURLBytes bounds a request's URL (414 past it); zero means 8 KiB.
	MaxURLBytes int

	// Streams appends every change published through this node to its
	// tenant's Redis Stream, tails the streams of the tenants watched here
	// to close Pub/Sub gaps, and resumes SSE clients from stream cursors
	// (package stream). Needs RedisURL.
	Streams bool
	// StreamMaxLen trims each stream with MAXLEN ~; zero means 10000.
	StreamMaxLen int64
	// StreamClusterReads bounds, on Redis Cluster, the tailer's blocking
	// reads per master (stream.Config.ClusterReads); zero means 128.
	StreamClusterReads int
	// AnnounceReconcileInterval is, on Redis Cluster or with the cache and
	// realtime roles on two Redis servers, how often the node announces
	// the snapshots of publishes that died between their write and their
	// announcement (fanout.Reconciler), jittered; zero means 5s.
	AnnounceReconcileInterval time.Duration
	// RepairInterval is, on a Redis mode, how often every watched task is
	// checked against Redis and, with PostgreSQL, the database (one node
	// of the fleet per task and interval), so that a change never
	// announced reaches its watchers within the interval plus a second;
	// zero means the hub's default (10s).
	RepairInterval time.Duration

	// Sessions configures the lookups of opaque session tokens (negative
	// cache, PostgreSQL bound); the node sets its Redis (the control role),
	// DB and Prefix. Without Redis there are no session tokens.
	Sessions session.Config

	// Admission configures connect rate limits, API plan limits and
	// connection caps (package admission); the node sets its Redis (the
	// control role; none in the embedded mode), Prefix and Logger.
	Admission admission.Config

	// Demo serves the demo page and its task simulator at /demo/; the
	// embedded mode always does.
	Demo bool

	Logger *slog.Logger // nil means slog.Default()
}

// Embedded reports whether cfg runs without Redis and PostgreSQL.
func (c Config) Embedded() bool { return c.RedisURL == "" && c.DatabaseURL == "" }

// withDefaults fills the zero settings the node itself gives a default;
// the components it builds fill their own.
func (c Config) withDefaults() Config {
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.ReconnectAfter <= 0 {
		c.ReconnectAfter = 5 * time.Second
	}
	if c.StreamMaxLen <= 0 {
		c.StreamMaxLen = 10000
	}
	if c.RequestTimeout <= 0 {
		c.RequestTimeout = 10 * time.Second
	}
	if c.MaxHeaderBytes <= 0 {
		c.MaxHeaderBytes = 64 << 10
	}
	return c
}

// A SettingError is a setting no mode of the node runs with. Setting is
// the name operators know it by: pushd's flag, without the dashes
// (docs/CONFIG.md).
type SettingError struct {
	Setting string
	Problem string
}

func (e *SettingError) Error() string { return "--" + e.Setting + ": " + e.Problem }

// Problems lists every combination of settings that no mode runs with,
// in a fixed order. It is the one place these rules live: New refuses a
// Config with problems, and cmd/pushd reports them with the rest of its
// settings' errors, each with where its value came from. A single value
// out of range (a negative duration, say) is the parser's to refuse.
func (c Config) Problems() []*SettingError {
	var out []*SettingError
	bad := func(setting, problem string) { out = append(out, &SettingError{setting, problem}) }
	roles := []struct{ setting, url string }{
		{"redis-cache-url", c.RedisCacheURL}, {"redis-control-url", c.RedisControlURL}, {"redis-realtime-url", c.RedisRealtimeURL},
	}
	if c.RedisURL == "" {
		if c.DatabaseURL != "" {
			bad("database-url", "needs --redis-url (set neither for the embedded mode)")
		}
		if c.RedisCluster {
			bad("redis-cluster", "needs --redis-url with the cluster's seed nodes")
		}
		if c.Streams {
			bad("streams", "needs --redis-url")
		}
		for _, r := range roles {
			if r.url != "" {
				bad(r.setting, "needs --redis-url")
			}
		}
	}
	if c.RedisCluster && strings.ContainsAny(c.KeyPrefix, "{}") {
		// Redis Cluster hashes the first {...} of a key: a braced prefix
		// would put every key and channel of the fleet in one slot.
		bad("key-prefix", "must not contain { or } with --redis-cluster: every key would hash to the prefix's one slot")
	}
	if c.RedisCluster {
		for _, r := range roles {
			if r.url != "" {
				bad(r.setting, "is for standalone Redis; with --redis-cluster the cluster serves every role")
			}
		}
	} else if c.Streams && c.RedisURL != "" && cmp.Or(c.RedisCacheURL, c.RedisURL) != cmp.Or(c.RedisRealtimeURL, c.RedisURL) {
		bad("streams", "needs the cache and realtime roles on one Redis: a publish writes the snapshot and appends to the stream in one script")
	}
	noKey := len(c.JWTSecret) == 0 && len(c.JWTPublicKeyPEM) == 0
	if noKey && !c.Embedded() {
		bad("jwt-secret", "set --jwt-secret or --jwt-public-key: only the embedded mode makes a secret up")
	}
	if noKey {
		// The embedded mode's demo tokens carry neither claim.
		if len(c.JWTAudience) > 0 {
			bad("jwt-audience", "needs --jwt-secret or --jwt-public-key: it restricts the tokens of a real issuer")
		}
		if c.JWTIssuer != "" {
			bad("jwt-issuer", "needs --jwt-secret or --jwt-public-key: it restricts the tokens of a real issuer")
		}
	}
	return out
}
