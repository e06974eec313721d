package node

import (
	"cmp"
	"flag"
	"log/slog"
	"strings"
	"time"

	"github.com/pushd/pushd/admission"
	"github.com/pushd/pushd/auth"
	"github.com/pushd/pushd/auth/session"
	"github.com/pushd/pushd/converge"
	"github.com/pushd/pushd/hub"
	"github.com/pushd/pushd/internal/flagval"
	"github.com/pushd/pushd/node/internal/api"
	"github.com/pushd/pushd/sse"
	"github.com/pushd/pushd/stream"
	"github.com/pushd/pushd/ws"
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

	NodeName string
	Version  string // the build's version, shown by GET /

	// AdminHosts are the DNS names the admin listener answers to besides
	// IP literals and localhost, compared with a request's Host less its
	// port and case-insensitively; any other Host gets 403
	// host_not_allowed on every route, so a page that DNS-rebinds its own
	// name to the admin address reads nothing. nil means none: scrape by
	// pod IP, or list the Service's name here.
	AdminHosts []string

	// ReconnectAfter bounds the random delay draining clients wait before
	// reconnecting; zero means 5s.
	ReconnectAfter time.Duration
	// RequestTimeout bounds how long a request, headers and body, may take
	// to arrive; zero means 10s. Streams are not bounded by it once they
	// are established.
	RequestTimeout time.Duration
	// MaxHeaderBytes bounds a request's line and headers (431 past it);
	// zero means 64 KiB.
	MaxHeaderBytes int
	// MaxConns bounds the streams this node holds (503 past it); zero
	// means the open-file limit less 1,000 descriptors kept for Redis,
	// PostgreSQL and requests.
	MaxConns int

	// Streams appends every change published through this node to its
	// tenant's Redis Stream, tails the streams of the tenants watched here
	// to close Pub/Sub gaps, and resumes SSE clients from stream cursors
	// (package stream). Needs RedisURL.
	Streams bool
	// StreamMaxLen trims each stream with MAXLEN ~, on publish and on
	// reconcile; zero means 10000.
	StreamMaxLen int64
	// ReadChanges makes the node one of the fleet's change readers: the
	// one holding the lease listens to PostgreSQL's committed changes of
	// generation_tasks and publishes each (package converge), so a Task
	// State Service may commit the row alone. Needs DatabaseURL and the
	// trigger of db/migrations/0006_task_changes.sql.
	ReadChanges bool

	// The components' settings, each documented, and given its default,
	// in its own package (WithDefaults, DefaultConfig). The node fills in
	// what wires them to each other, named on each; what a caller sets
	// there is replaced.

	// Hub: connections, writers, repair and the per-connection limits
	// both transports keep. The node sets Source, Bus, Stream, Plans,
	// NodeName and Logger.
	Hub hub.Config
	// SSE: the EventSource transport. The node sets Hub and Logger.
	SSE sse.Config
	// WS: the WebSocket transport. The node sets Hub, Authenticate,
	// Logger, and OriginPatterns to API.OriginPatterns.
	WS ws.Config
	// API: the HTTP surface. Its settings are MaxConnsPerIP, MaxIDs,
	// MaxURLBytes, TrustedProxies, OriginPatterns and the AuthFailure
	// limits; the node sets the rest, MaxConns from its own.
	API api.Config
	// Stream: the tailer of the tenants' streams, with Streams. The node
	// sets Client, Names and Logger.
	Stream stream.Config
	// Reconcile: on Redis Cluster, or with the cache and realtime roles
	// on two Redis servers, the announcing of the snapshots of publishes
	// that died between their write and their announcement. The node
	// sets everything but Interval and Grace.
	Reconcile converge.ReconcileConfig

	// Sessions configures the lookups of opaque session tokens (negative
	// cache, PostgreSQL bound); the node sets its Redis (the control role),
	// DB, Prefix and Logger. Without Redis there are no session tokens.
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

// DefaultConfig is the settings a node runs with unless told otherwise,
// as cmd/pushd's flags take them: WithDefaults, and the limits whose zero
// means none that the components name as their production ones.
func DefaultConfig() Config {
	c := Config{JWTMaxTTL: auth.DefaultMaxTTL, Hub: hub.DefaultConfig(), API: api.DefaultConfig(), Admission: admission.DefaultConfig()}
	return c.WithDefaults()
}

// WithDefaults returns c with each zero setting that has a default set to
// it: the node's own here, the components' by their WithDefaults.
func (c Config) WithDefaults() Config {
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
	c.Hub = c.Hub.WithDefaults()
	c.SSE = c.SSE.WithDefaults()
	c.WS = c.WS.WithDefaults()
	c.API = c.API.WithDefaults()
	c.Stream = c.Stream.WithDefaults()
	c.Reconcile = c.Reconcile.WithDefaults()
	c.Sessions = c.Sessions.WithDefaults()
	c.Admission = c.Admission.WithDefaults()
	return c
}

// RegisterFlags defines on fs a flag for each setting of c an operator
// sets, the node's own and its components', bound to its field, with the
// field's value as its default: call it on DefaultConfig. The settings
// that take parsing (keys, audiences, origins, proxies) are cmd/pushd's.
func (c *Config) RegisterFlags(fs *flag.FlagSet) {
	fs.StringVar(&c.RedisURL, "redis-url", c.RedisURL, "Redis URL (redis://host:port/db); empty with no database URL runs the embedded mode")
	fs.BoolVar(&c.RedisCluster, "redis-cluster", c.RedisCluster, "--redis-url lists seed nodes of a Redis Cluster, comma-separated; notifications travel on sharded Pub/Sub")
	fs.StringVar(&c.KeyPrefix, "key-prefix", c.KeyPrefix, "prefix of every Redis key and channel, for sharing one Redis between environments (a database number separates keys, not Pub/Sub channels); with --redis-cluster it must hold no { or }")
	fs.StringVar(&c.DatabaseURL, "database-url", c.DatabaseURL, "PostgreSQL URL (pgx), the fallback and fact source behind Redis")
	fs.StringVar(&c.RedisCacheURL, "redis-cache-url", c.RedisCacheURL, "Redis for task snapshots; empty means --redis-url")
	fs.StringVar(&c.RedisControlURL, "redis-control-url", c.RedisControlURL, "Redis for rate limits, connection leases and sessions; empty means --redis-url")
	fs.StringVar(&c.RedisRealtimeURL, "redis-realtime-url", c.RedisRealtimeURL, "Redis for Pub/Sub and streams; empty means --redis-url")
	fs.StringVar(&c.JWTAlgorithm, "jwt-algorithm", c.JWTAlgorithm, "pin the token algorithm (HS256, RS256, ES256, EdDSA); default from the key")
	fs.StringVar(&c.JWTIssuer, "jwt-issuer", c.JWTIssuer, "the iss claim every token must carry (401 otherwise); empty checks no issuer")
	flagval.Duration(fs, &c.JWTMaxTTL, "jwt-max-ttl", "longest lifetime a token may claim, exp - iat (exp - now when it has no iat); a longer one is refused with 401, and pushd token mints within it")
	fs.StringVar(&c.APIKey, "api-key", c.APIKey, "key for POST /v1/publish (X-API-Key); empty allows loopback callers only")
	fs.StringVar(&c.NodeName, "node-name", c.NodeName, "name shown in hello and metrics; empty means the host name")
	flagval.Duration(fs, &c.ReconnectAfter, "reconnect-after", "clients of a draining node reconnect after a random delay up to this")
	fs.BoolVar(&c.Streams, "streams", c.Streams, "also append every change to the tenant's Redis Stream, tail the streams to close Pub/Sub gaps, and resume SSE clients from stream cursors")
	fs.Int64Var(&c.StreamMaxLen, "stream-maxlen", c.StreamMaxLen, "with --streams, trim each tenant's stream to about this many entries (XADD MAXLEN ~)")
	fs.BoolVar(&c.ReadChanges, "read-changes", c.ReadChanges, "publish every change committed to generation_tasks (one node of the fleet listens at a time; needs --database-url and db/migrations/0006_task_changes.sql), so a Task State Service may commit the row alone")
	fs.BoolVar(&c.Demo, "demo", c.Demo, "serve the demo page and its task simulator at /demo/ (the embedded mode always does); with a configured secret or key the page asks for a token; with a database the simulator writes generation_tasks rows, as a Task State Service would")
	fs.IntVar(&c.MaxConns, "max-conns", c.MaxConns, "streams this node holds before it answers 503; 0 means the open-file limit less 1,000 kept for Redis, PostgreSQL and requests")
	flagval.Duration(fs, &c.RequestTimeout, "request-timeout", "how long a request may take to arrive, headers and body; a connection still waiting for one is closed (a publish is answered 408 first); established streams are not bounded by it")
	fs.IntVar(&c.MaxHeaderBytes, "max-header-bytes", c.MaxHeaderBytes, "longest request line and headers, in bytes (431 past it)")
	c.Hub.RegisterFlags(fs)
	c.SSE.RegisterFlags(fs)
	c.WS.RegisterFlags(fs)
	c.API.RegisterFlags(fs)
	c.Stream.RegisterFlags(fs)
	c.Reconcile.RegisterFlags(fs)
	c.Sessions.RegisterFlags(fs)
	c.Admission.RegisterFlags(fs)
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
		if c.ReadChanges {
			bad("read-changes", "needs --redis-url and --database-url")
		}
		for _, r := range roles {
			if r.url != "" {
				bad(r.setting, "needs --redis-url")
			}
		}
	}
	if c.ReadChanges && c.RedisURL != "" && c.DatabaseURL == "" {
		bad("read-changes", "needs --database-url: the changes are PostgreSQL's")
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
		bad("jwt-secret", "set --jwt-secret (make one: openssl rand -base64 32) or --jwt-public-key: only the embedded mode makes a secret up")
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
