// Package node wires a pushd node from its settings: the snapshot source,
// the bus, the hub, the transports and the HTTP API, in the embedded mode
// (in memory) or the production mode (Redis and PostgreSQL). cmd/pushd and
// the end-to-end tests both start nodes through it.
package node

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/redis/go-redis/v9"

	"github.com/pushd/pushd/admission"
	"github.com/pushd/pushd/auth"
	"github.com/pushd/pushd/auth/session"
	"github.com/pushd/pushd/fanout"
	"github.com/pushd/pushd/hub"
	"github.com/pushd/pushd/internal/api"
	"github.com/pushd/pushd/internal/metrics"
	"github.com/pushd/pushd/keys"
	"github.com/pushd/pushd/snapshot"
	"github.com/pushd/pushd/snapshot/store"
	"github.com/pushd/pushd/sse"
	"github.com/pushd/pushd/stream"
	"github.com/pushd/pushd/web"
	"github.com/pushd/pushd/web/sim"
	"github.com/pushd/pushd/ws"
)

// Config is a node's settings. With neither RedisURL nor DatabaseURL the
// node runs embedded: one node, an in-memory bus and store.
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
	// LivenessInterval is how often the bus checks its subscription by
	// publishing to itself; zero: the bus's default (1s).
	LivenessInterval time.Duration
	WriteTimeout     time.Duration // zero: the transports' default
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
	// 1008 (10). FirstRequestTimeout: how long a WebSocket may wait before
	// its first request (10s).
	MaxSubscriptions    int
	MaxIDs              int
	SubscribeTimeout    time.Duration
	WSMaxMessageBytes   int64
	WSRequestRate       float64
	WSRequestBurst      int
	WSMaxBadMessages    int
	FirstRequestTimeout time.Duration
	// SubscribeReads and SubscribeReadBurst are each user's budget, on
	// this node, of snapshot reads that subscriptions cause (50/s, bursts
	// of 500); ids past it are refused with rate_limited.
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
	// DisconnectCheck is how often SSE connections held without a goroutine
	// are checked for a client that went away; zero: the SSE default (5s).
	DisconnectCheck time.Duration
	// ReconnectAfter bounds the random delay draining clients wait before
	// reconnecting; zero means 5s.
	ReconnectAfter time.Duration
	// SnapshotFetchTimeout bounds one snapshot read (a quarter of it for
	// Redis, the rest for PostgreSQL); zero means the store's 3s.
	SnapshotFetchTimeout time.Duration
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
	// DemoStep is the simulator's time between two states of a task;
	// zero: the simulator's default.
	DemoStep time.Duration

	Logger *slog.Logger // nil means slog.Default()
}

// Node is a running pushd node.
type Node struct {
	cfg      Config
	log      *slog.Logger
	handler  http.Handler
	hub      *hub.Hub
	sse      *sse.Handler
	ws       *ws.Handler
	bus      fanout.Bus
	redisBus *fanout.RedisBus // nil in the embedded mode and on a cluster
	busStats metrics.BusStats // the Redis bus or the cluster bus; nil embedded
	tailer   *stream.Tailer   // nil without streams
	rdb      *redis.Client    // standalone realtime role: Pub/Sub and streams
	cluster  *redis.ClusterClient
	realtime redis.UniversalClient // rdb or cluster
	cache    redis.UniversalClient // the cache role: snapshots
	control  redis.UniversalClient // the control role: admission
	clients  map[string]*redis.Client
	adm      *admission.Controller
	pool     *pgxpool.Pool
	store    *store.Store
	sim      *sim.Simulator // nil unless the demo is served
	srv      *http.Server
	sources  sourceStates // for /readyz

	// DemoSecret is the random HS256 secret of an embedded node started
	// without one; tokens for it come from GET /demo/token.
	DemoSecret []byte
}

// Embedded reports whether cfg runs without Redis and PostgreSQL.
func (c Config) Embedded() bool { return c.RedisURL == "" && c.DatabaseURL == "" }

// The hub is the handler of every bus; it implements both interfaces without
// naming them, so the assertion lives here, where the two meet.
var (
	_ fanout.Handler     = (*hub.Hub)(nil)
	_ fanout.LossHandler = (*hub.Hub)(nil)
)

// New builds a node and connects it to its servers. It does not listen yet.
func New(ctx context.Context, cfg Config) (*Node, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.ReconnectAfter <= 0 {
		cfg.ReconnectAfter = 5 * time.Second
	}
	if cfg.DatabaseURL != "" && cfg.RedisURL == "" {
		return nil, errors.New("a database URL needs a Redis URL")
	}
	if cfg.Streams && cfg.RedisURL == "" {
		return nil, errors.New("streams need a Redis URL")
	}
	if cfg.StreamMaxLen <= 0 {
		cfg.StreamMaxLen = 10000
	}
	if cfg.RequestTimeout <= 0 {
		cfg.RequestTimeout = 10 * time.Second
	}
	if cfg.MaxHeaderBytes <= 0 {
		cfg.MaxHeaderBytes = 64 << 10
	}
	n := &Node{cfg: cfg, log: cfg.Logger, sources: sourceStates{log: cfg.Logger, down: map[string]bool{}}}
	ok := false
	defer func() {
		if !ok {
			n.Close()
		}
	}()

	var demoSigner *auth.Signer
	if len(cfg.JWTSecret) == 0 && len(cfg.JWTPublicKeyPEM) == 0 {
		if !cfg.Embedded() {
			return nil, errors.New("set a JWT secret or public key (only the embedded mode makes one up)")
		}
		cfg.JWTSecret = auth.RandomSecret()
		n.DemoSecret = cfg.JWTSecret
		demoSigner = auth.NewSigner(cfg.JWTSecret)
	}

	var (
		source    snapshot.Source
		publisher fanout.Publisher
		ready     func(context.Context) (map[string]string, error)
		hubBus    hub.Bus
		hubStream hub.Stream // stays a nil interface without streams
	)
	if cfg.Embedded() {
		store := snapshot.NewMemoryStore()
		bus := fanout.NewMemoryBus()
		n.bus = bus
		source = store
		publisher = &fanout.MemoryPublisher{Store: store, Bus: bus}
	} else {
		if err := n.dialRoles(); err != nil {
			return nil, err
		}
		if cfg.DatabaseURL != "" {
			pcfg, err := pgxpool.ParseConfig(cfg.DatabaseURL)
			if err != nil {
				return nil, fmt.Errorf("database url: %w", err)
			}
			if pcfg.MaxConns > 16 {
				pcfg.MaxConns = 16 // the fallback is capped below this anyway
			}
			// Connections are made lazily: a node starts while PostgreSQL is
			// down and serves from Redis meanwhile.
			n.pool, err = pgxpool.NewWithConfig(ctx, pcfg)
			if err != nil {
				return nil, fmt.Errorf("database: %w", err)
			}
			n.checkDatabase(ctx, &pcfg.ConnConfig.Config)
		}
		names := keys.Names{Prefix: cfg.KeyPrefix, Cluster: cfg.RedisCluster}
		n.store = store.NewStore(store.Config{Redis: n.cache, DB: n.pool, Names: names, FetchTimeout: cfg.SnapshotFetchTimeout, Logger: cfg.Logger})
		if n.cluster != nil {
			cb := fanout.NewClusterBus(fanout.ClusterConfig{Client: n.cluster, Names: names, LivenessInterval: cfg.LivenessInterval, Logger: cfg.Logger})
			n.bus, n.busStats = cb, cb
		} else {
			n.redisBus = fanout.NewRedisBus(fanout.RedisConfig{Client: n.rdb, Names: names, LivenessInterval: cfg.LivenessInterval, Logger: cfg.Logger})
			n.bus, n.busStats = n.redisBus, n.redisBus
		}
		source = n.store
		publisher = n.publisher(names)
		ready = n.ready
		if cfg.Streams {
			// n.realtime is the standalone realtime Redis or the cluster;
			// on a cluster the publisher appends in the tenant's slot after
			// the snapshot write (rediswrite.Announce), and the tailer reads
			// each master's streams in pipelined rounds.
			n.tailer = stream.NewTailer(stream.Config{Client: n.realtime, Names: names, Logger: cfg.Logger})
			hubBus, hubStream = n.tailer.Subscriber(n.bus), n.tailer
			publisher = fanout.NewRedisPublisher(n.realtime, names, fanout.WithStream(cfg.StreamMaxLen))
		}
	}
	counted := &countingPublisher{Publisher: publisher}
	publisher = counted
	if hubBus == nil {
		hubBus = n.bus
	}

	// Session tokens live in the control Redis, with PostgreSQL behind.
	var sessions *session.Store
	if n.control != nil {
		scfg := cfg.Sessions
		scfg.Redis, scfg.DB, scfg.Prefix = n.control, n.pool, cfg.KeyPrefix
		sessions = session.New(scfg)
	}
	vcfg := auth.Config{Secret: cfg.JWTSecret, PublicKeyPEM: cfg.JWTPublicKeyPEM, Algorithm: cfg.JWTAlgorithm,
		Audience: cfg.JWTAudience, Issuer: cfg.JWTIssuer, MaxTTL: cfg.JWTMaxTTL}
	if sessions != nil { // a nil *session.Store in the interface would not be nil
		vcfg.Sessions = sessions
	}
	verifier, err := auth.New(vcfg)
	if err != nil {
		return nil, err
	}
	acfg := cfg.Admission
	if sessions != nil {
		acfg.Sessions = sessions
	}
	acfg.Prefix, acfg.Logger = cfg.KeyPrefix, cfg.Logger
	if n.control != nil {
		acfg.Redis = n.control
	}
	n.adm = admission.New(acfg)

	n.hub = hub.New(hub.Config{
		Source: source, Bus: hubBus, Stream: hubStream, HeartbeatInterval: cfg.Heartbeat, PollInterval: cfg.PollInterval,
		NodeName: cfg.NodeName, Logger: cfg.Logger, Writers: cfg.Writers,
		MaxSubscriptions: cfg.MaxSubscriptions, SubscribeReads: cfg.SubscribeReads, SubscribeReadBurst: cfg.SubscribeReadBurst,
		HotTaskWatchers: cfg.HotTaskWatchers,
	})
	n.bus.Start(n.hub)
	if n.tailer != nil {
		n.tailer.Start(n.hub)
	}
	n.ws = ws.New(ws.Config{Hub: n.hub, OriginPatterns: cfg.OriginPatterns, WriteTimeout: cfg.WriteTimeout,
		ReadLimit: cfg.WSMaxMessageBytes, MaxBadMessages: cfg.WSMaxBadMessages, MaxIDs: cfg.MaxIDs,
		FirstRequestTimeout: cfg.FirstRequestTimeout, RequestRate: cfg.WSRequestRate, RequestBurst: cfg.WSRequestBurst,
		SubscribeTimeout: cfg.SubscribeTimeout, SendBuffer: cfg.SendBuffer, Logger: cfg.Logger})
	n.sse = sse.New(sse.Config{Hub: n.hub, Retry: cfg.SSERetry, WriteTimeout: cfg.WriteTimeout,
		SubscribeTimeout: cfg.SubscribeTimeout, MaxTasks: cfg.MaxIDs, SendBuffer: cfg.SendBuffer,
		CheckInterval: cfg.DisconnectCheck, Logger: cfg.Logger})
	var demo http.Handler
	if cfg.Demo || cfg.Embedded() {
		// With a database the simulator commits each state there before it
		// publishes, as a Task State Service does; n.pool is nil otherwise.
		n.sim = sim.New(sim.Config{Publisher: publisher, DB: n.pool, Step: cfg.DemoStep, Logger: cfg.Logger})
		demo = web.Demo(web.DemoConfig{Sim: n.sim, Auth: verifier, Tokens: demoSigner != nil, Logger: cfg.Logger})
	}
	n.handler = api.New(api.Config{
		Hub: n.hub, Source: source, Publisher: publisher, Auth: verifier,
		SSE:        n.sse,
		WS:         n.ws,
		APIKey:     cfg.APIKey,
		Ready:      ready,
		DemoSigner: demoSigner,
		Demo:       demo,
		Client:     web.Client(),
		Version:    cfg.Version,
		Admission:  n.adm,
		MaxConns:   cfg.MaxConns, MaxConnsPerIP: cfg.MaxConnsPerIP, MaxURLBytes: cfg.MaxURLBytes,
		OriginPatterns:   cfg.OriginPatterns,
		TrustedProxies:   cfg.TrustedProxies,
		AuthFailureBurst: cfg.AuthFailureBurst, AuthFailureRate: cfg.AuthFailureRate, AuthFailureAddresses: cfg.AuthFailureAddresses,
		Metrics: promhttp.HandlerFor(metrics.NewRegistry(metrics.Sources{Hub: n.hub, Store: n.store, Bus: n.busStats, Stream: n.tailer, Admission: n.adm, Publisher: counted}),
			promhttp.HandlerOpts{ErrorLog: slog.NewLogLogger(cfg.Logger.Handler(), slog.LevelWarn)}),
		Logger: cfg.Logger,
	})
	// Made here, not in Serve, so Shutdown from another goroutine always
	// finds it.
	// ReadTimeout bounds the reading of a request, body included: without
	// it a Content-Length whose body never comes holds a connection for
	// good. It ends there: net/http clears the deadline once the body is
	// read, and taking a stream's connection over (SSE, the WebSocket
	// upgrade) clears it too.
	n.srv = &http.Server{
		Handler:           n.handler,
		ReadHeaderTimeout: cfg.RequestTimeout,
		ReadTimeout:       cfg.RequestTimeout,
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    cfg.MaxHeaderBytes,
		ErrorLog:          slog.NewLogLogger(cfg.Logger.Handler(), slog.LevelDebug),
	}
	ok = true
	return n, nil
}

// dbCheckTimeout bounds the start-up check of PostgreSQL.
const dbCheckTimeout = 2 * time.Second

// checkDatabase warns when PostgreSQL does not answer at start. The node
// starts anyway and the pool connects once it answers; but without this,
// nothing would say so until the first read Redis cannot serve. The
// address is logged, never the password (nor pgx's errors carry it).
func (n *Node) checkDatabase(ctx context.Context, c *pgconn.Config) {
	ctx, cancel := context.WithTimeout(ctx, dbCheckTimeout)
	defer cancel()
	if err := n.pool.Ping(ctx); err != nil {
		n.log.Warn("postgres does not answer at start; serving from Redis until it does",
			"addr", net.JoinHostPort(c.Host, strconv.Itoa(int(c.Port))), "database", c.Database, "user", c.User, "err", err)
	}
}

// ready: the node can serve while either snapshot source answers. Both
// are asked at once, so a stalled one cannot spend the other's deadline.
// /readyz is public, so its checks give each source's state only; why a
// source is down goes to the log.
func (n *Node) ready(ctx context.Context) (map[string]string, error) {
	var redisErr, pgErr error
	var wg sync.WaitGroup
	wg.Go(func() { redisErr = n.cache.Ping(ctx).Err() })
	if n.pool != nil {
		wg.Go(func() { pgErr = n.pool.Ping(ctx) })
	}
	wg.Wait()
	// A probe its caller gave up on says nothing about the sources; were it
	// counted, hanging up on /readyz would make them flap in the log.
	record := !errors.Is(ctx.Err(), context.Canceled)
	checks := map[string]string{"redis": n.sources.state("redis", redisErr, record), "postgres": "not configured"}
	if n.pool != nil {
		checks["postgres"] = n.sources.state("postgres", pgErr, record)
	}
	if redisErr == nil || (n.pool != nil && pgErr == nil) {
		return checks, nil
	}
	return checks, errors.New("no snapshot source answers")
}

// sourceStates remembers whether each snapshot source was down at the last
// probe, so that a source's error is logged when its state changes, not on
// every probe: anyone may ask /readyz, as often as they like.
type sourceStates struct {
	log  *slog.Logger
	mu   sync.Mutex
	down map[string]bool
}

// state is a source's check, "ok" or "down"; with record, a change from the
// last recorded state is logged, with err when the source went down.
func (s *sourceStates) state(source string, err error, record bool) string {
	if record {
		s.mu.Lock()
		was := s.down[source]
		s.down[source] = err != nil
		s.mu.Unlock()
		switch {
		case err != nil && !was:
			s.log.Warn("snapshot source down", "source", source, "err", err)
		case err == nil && was:
			s.log.Info("snapshot source answers again", "source", source)
		}
	}
	if err != nil {
		return "down"
	}
	return "ok"
}

// Handler is the node's HTTP handler.
func (n *Node) Handler() http.Handler { return n.handler }

// Store is the node's Redis and PostgreSQL snapshot store; nil in the
// embedded mode.
func (n *Node) Store() *store.Store { return n.store }

// Hub is the node's hub.
func (n *Node) Hub() *hub.Hub { return n.hub }

// Admission is the node's admission controller.
func (n *Node) Admission() *admission.Controller { return n.adm }

// Stream is the node's stream tailer; nil without streams.
func (n *Node) Stream() *stream.Tailer { return n.tailer }

// Serve accepts connections on l until Shutdown or Close. Serve after
// Shutdown returns at once.
func (n *Node) Serve(l net.Listener) error {
	err := n.srv.Serve(l)
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}

// Shutdown drains the node: it tells clients to reconnect after a jittered
// delay and closes connections in batches within ctx's deadline, then stops
// accepting and releases the servers. The listener stays open while the
// hub drains, so a balancer's health check and new connections get 503
// draining (a JSON body with the code) rather than a refused connection.
func (n *Node) Shutdown(ctx context.Context) error {
	err := n.hub.Shutdown(ctx, n.cfg.ReconnectAfter)
	if n.srv != nil {
		if serr := n.srv.Shutdown(ctx); err == nil {
			err = serr
		}
	}
	n.Close()
	return err
}

// Close stops the node at once. It is idempotent.
func (n *Node) Close() {
	if n.srv != nil {
		n.srv.Close()
	}
	if n.sim != nil {
		n.sim.Close() // before the bus and store its walks publish through
	}
	if n.hub != nil {
		n.hub.Close()
	}
	if n.sse != nil {
		n.sse.Close() // after the hub: it closes what the hub ended
	}
	if n.ws != nil {
		n.ws.Wait() // the hub ended every connection; their readers finish
	}
	if n.bus != nil {
		n.bus.Close()
	}
	if n.tailer != nil {
		n.tailer.Close() // after the hub: its readers deliver to it
	}
	if n.store != nil {
		n.store.Close() // waits for fetches callers gave up on, before their clients go
	}
	if n.adm != nil {
		n.adm.Close() // after the hub: it releases what the closed connections held
	}
	for _, c := range n.clients {
		c.Close()
	}
	if n.cluster != nil {
		n.cluster.Close()
	}
	if n.pool != nil {
		n.pool.Close()
	}
}

// LogStartup logs how the node runs.
func (n *Node) LogStartup(addr string) {
	if n.cfg.Embedded() {
		n.log.Info("pushd serving in embedded mode (in-memory bus and store, one node)", "addr", addr, "node", n.cfg.NodeName)
		return
	}
	n.log.Info("pushd serving", "addr", addr, "node", n.cfg.NodeName, "redis", true, "redis_cluster", n.cluster != nil,
		"postgres", n.pool != nil, "streams", n.tailer != nil)
}

// Hints are the commands that feed an embedded node, for a person at a
// terminal; a node with Redis has none.
func (n *Node) Hints(addr string) []string {
	if !n.cfg.Embedded() {
		return nil
	}
	base := "http://" + displayAddr(addr)
	out := []string{"open the demo:    " + base + "/demo/"}
	if n.DemoSecret != nil {
		out = append(out, "get a token:      TOKEN=$(curl -s '"+base+"/demo/token?tenant=t1&user=u1' | sed 's/.*\"token\":\"\\([^\"]*\\)\".*/\\1/')")
	}
	return append(out,
		"watch a task:     curl -N -H \"Authorization: Bearer $TOKEN\" '"+base+"/v1/events?task=task_1'",
		"publish a change: curl -X POST "+base+"/v1/publish -d '{\"task_id\":\"task_1\",\"tenant_id\":\"t1\",\"project_id\":\"p1\",\"user_id\":\"u1\",\"status\":\"RUNNING\",\"progress\":45,\"version\":1,\"updated_at\":1710000000000}'",
	)
}

func displayAddr(addr string) string {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return addr
	}
	if host == "" || host == "::" || host == "0.0.0.0" {
		host = "localhost"
	}
	return net.JoinHostPort(host, port)
}
