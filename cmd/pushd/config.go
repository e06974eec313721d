package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"strings"
	"time"

	"github.com/pushd/pushd/admission"
	"github.com/pushd/pushd/auth"
	"github.com/pushd/pushd/auth/session"
	"github.com/pushd/pushd/hub"
	"github.com/pushd/pushd/internal/node"
)

// config is every setting of a node. Each flag has a PUSHD_* environment
// twin and a key in the optional config file; precedence is flag, then
// environment, then file, then default.
type config struct {
	ConfigFile     string
	Listen         string
	RedisURL       string
	KeyPrefix      string
	DatabaseURL    string
	JWTSecret      string
	JWTSecretFile  string
	JWTPublicKey   string
	JWTAlgorithm   string
	JWTAudience    string
	JWTIssuer      string
	JWTMaxTTL      time.Duration
	APIKey         string
	APIKeyFile     string
	NodeName       string
	Origins        string
	TrustedProxies string
	Heartbeat      time.Duration
	PollInterval   time.Duration
	WriteTimeout   time.Duration
	Retry          time.Duration
	DrainTimeout   time.Duration
	ReconnectAfter time.Duration
	DebugListen    string
	AdminListen    string
	Streams        bool
	StreamMaxLen   int64
	StreamReads    int
	AnnounceRepair time.Duration
	RepairInterval time.Duration
	RedisCluster   bool
	Demo           bool
	LogLevel       string
	LogFormat      string
	MaxConns       int
	MaxConnsPerIP  int
	RequestTimeout time.Duration
	MaxHeaderBytes int
	MaxURLBytes    int
	Conn           connFlags

	AuthFailureBurst     int
	AuthFailureRate      float64
	AuthFailureAddresses int
	Sessions             sessionFlags

	RedisCacheURL    string
	RedisControlURL  string
	RedisRealtimeURL string
	Admission        admissionFlags

	// warnings are what the start logs and goes on: unknown PUSHD_*
	// variables, a short secret.
	warnings []warning
	from     origins // where each setting came from, for messages
	jwtPEM   []byte  // --jwt-public-key's file, read by load
}

// connFlags are the per-connection limits and the writer pool.
type connFlags struct {
	Writers, MaxSubscriptions, MaxIDs     int
	WSMaxMessageBytes                     int64
	WSRequestRate, WSControlFrames        float64
	WSRequestBurst, WSMaxBadMessages      int
	FirstRequestTimeout, SubscribeTimeout time.Duration
	SubscribeReads                        float64
	SubscribeReadBurst                    int
	SendBuffer                            int
	HotTaskWatchers                       int
}

// admissionFlags are the admission limits (package admission); a limit of
// zero is none.
type admissionFlags struct {
	UserBurst, IPBurst           int
	UserRate, IPRate             float64
	MaxPerUser, MaxPerTenant     int
	Free, Pro, Enterprise        int
	DefaultPlan                  string
	APIWindow, PlanCacheTTL      time.Duration
	LeaseTTL, Renew, Reconcile   time.Duration
	ExpectedNodes                int
	Timeout, Retry, SessionCheck time.Duration
}

// sessionFlags are the session token lookups' settings (session.Config).
type sessionFlags struct {
	NegativeTTL     time.Duration
	NegativeEntries int
	DBQueries       int
	DBWait          time.Duration
}

// envName is a flag's environment twin: --redis-url is PUSHD_REDIS_URL.
func envName(flagName string) string {
	return "PUSHD_" + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// Where a setting came from, for messages: origins maps a flag name to
// fromFlag, its environment variable's name or file:line; a name missing
// from it kept its default.
const (
	fromFlag    = "the command line"
	fromDefault = "the default"
)

type origins map[string]string

func (o origins) of(name string) string {
	if s, ok := o[name]; ok {
		return s
	}
	return fromDefault
}

// settingError names the setting and where its value came from.
func (o origins) settingError(name, format string, args ...any) error {
	return fmt.Errorf("--%s (from %s): %s", name, o.of(name), fmt.Sprintf(format, args...))
}

// newFlagSet defines every setting on c. Defaults live here and only here:
// -h, docs/CONFIG.md (checked by a test) and the config file all read them
// from the flag set.
func newFlagSet(c *config) *flag.FlagSet {
	fs := flag.NewFlagSet("pushd", flag.ContinueOnError)
	fs.SetOutput(io.Discard) // parseArgs words the errors and prints -h
	fs.StringVar(&c.ConfigFile, "config", "", "file of settings, one \"name = value\" a line (names are the flags'); flags and the environment win over it")
	fs.StringVar(&c.Listen, "listen", ":8080", "address to serve")
	fs.StringVar(&c.RedisURL, "redis-url", "", "Redis URL (redis://host:port/db); empty with no database URL runs the embedded mode")
	fs.BoolVar(&c.RedisCluster, "redis-cluster", false, "--redis-url lists seed nodes of a Redis Cluster, comma-separated; notifications travel on sharded Pub/Sub")
	fs.StringVar(&c.KeyPrefix, "key-prefix", "", "prefix of every Redis key and channel, for sharing one Redis between environments; with --redis-cluster it must hold no { or }")
	fs.StringVar(&c.DatabaseURL, "database-url", "", "PostgreSQL URL (pgx), the fallback and fact source behind Redis")
	fs.StringVar(&c.JWTSecret, "jwt-secret", "", "HS256 secret for client tokens; at least 32 random bytes (a shorter one is warned of)")
	fs.StringVar(&c.JWTSecretFile, "jwt-secret-file", "", "file holding --jwt-secret, one trailing newline trimmed (for secrets mounted as files); set one of the two")
	fs.StringVar(&c.JWTPublicKey, "jwt-public-key", "", "PEM file of the RS256, ES256 or EdDSA public key for client tokens")
	fs.StringVar(&c.JWTAlgorithm, "jwt-algorithm", "", "pin the token algorithm (HS256, RS256, ES256, EdDSA); default from the key")
	fs.StringVar(&c.JWTAudience, "jwt-audience", "", "comma-separated audiences: a token's aud claim must name one of them (401 otherwise); empty checks no audience")
	fs.StringVar(&c.JWTIssuer, "jwt-issuer", "", "the iss claim every token must carry (401 otherwise); empty checks no issuer")
	durationVar(fs, &c.JWTMaxTTL, "jwt-max-ttl", auth.DefaultMaxTTL, "longest lifetime a token may claim, exp - iat (exp - now when it has no iat); a longer one is refused with 401, and pushd token mints within it")
	fs.StringVar(&c.APIKey, "api-key", "", "key for POST /v1/publish (X-API-Key); empty allows loopback callers only")
	fs.StringVar(&c.APIKeyFile, "api-key-file", "", "file holding --api-key, one trailing newline trimmed; set one of the two")
	fs.StringVar(&c.NodeName, "node-name", "", "name shown in hello and metrics; empty means the host name")
	fs.StringVar(&c.TrustedProxies, "trusted-proxies", "", "comma-separated addresses or CIDRs of load balancers whose X-Forwarded-For names the client for the per-address limits; empty trusts none")
	fs.StringVar(&c.Origins, "allowed-origins", "", "comma-separated origin patterns (host or scheme://host, with * wildcards) whose pages may open WebSockets and use the token cookie, besides the server's own host; other origins get 403")
	durationVar(fs, &c.Heartbeat, "heartbeat", 25*time.Second, "idle time after which a heartbeat is written")
	durationVar(fs, &c.PollInterval, "poll-interval", 2*time.Second, "while Pub/Sub is down, how often watched tasks are re-read (jittered)")
	durationVar(fs, &c.WriteTimeout, "write-timeout", 10*time.Second, "a client slower than this per write is disconnected")
	durationVar(fs, &c.Retry, "sse-retry", 2*time.Second, "base SSE reconnect delay (each connection adds up to 50% jitter)")
	durationVar(fs, &c.DrainTimeout, "drain-timeout", 10*time.Second, "how long shutdown spends closing connections")
	durationVar(fs, &c.ReconnectAfter, "reconnect-after", 5*time.Second, "clients of a draining node reconnect after a random delay up to this")
	fs.BoolVar(&c.Streams, "streams", false, "also append every change to the tenant's Redis Stream, tail the streams to close Pub/Sub gaps, and resume SSE clients from stream cursors")
	fs.Int64Var(&c.StreamMaxLen, "stream-maxlen", 10000, "with --streams, trim each tenant's stream to about this many entries (XADD MAXLEN ~)")
	fs.IntVar(&c.StreamReads, "stream-cluster-reads", 128, "with --streams on Redis Cluster, blocking stream reads (one per watched tenant, each on a connection of its own) this node keeps open on each master; the tenants past it are polled every second")
	durationVar(fs, &c.AnnounceRepair, "announce-reconcile-interval", 5*time.Second, "on Redis Cluster or with the cache and realtime roles apart, how often (jittered) this node announces the stored snapshots of watched tenants whose publisher died before announcing them")
	durationVar(fs, &c.RepairInterval, "repair-interval", hub.DefaultRepairInterval, "how often every watched task is checked against Redis and PostgreSQL (one node of the fleet per task), so a change written and never announced reaches its watchers within this plus 1s; finished tasks every 10th time")
	fs.StringVar(&c.DebugListen, "debug-listen", "", "address for net/http/pprof (e.g. 127.0.0.1:6060); empty serves none; keep it private")
	fs.StringVar(&c.AdminListen, "admin-listen", "127.0.0.1:9464", "address of the admin listener: /metrics (Prometheus), /healthz and /readyz; empty serves none; keep it private (the client listener never serves /metrics)")
	fs.BoolVar(&c.Demo, "demo", false, "serve the demo page and its task simulator at /demo/ (the embedded mode always does); with a configured secret or key the page asks for a token; with a database the simulator writes generation_tasks rows, as a Task State Service would")
	fs.StringVar(&c.RedisCacheURL, "redis-cache-url", "", "Redis for task snapshots; empty means --redis-url")
	fs.StringVar(&c.RedisControlURL, "redis-control-url", "", "Redis for rate limits, connection leases and sessions; empty means --redis-url")
	fs.StringVar(&c.RedisRealtimeURL, "redis-realtime-url", "", "Redis for Pub/Sub and streams; empty means --redis-url")
	fs.IntVar(&c.MaxConns, "max-conns", 0, "streams this node holds before it answers 503; 0 means the open-file limit less 1,000 kept for Redis, PostgreSQL and requests")
	fs.IntVar(&c.MaxConnsPerIP, "max-conns-per-ip", 5000, "streams one client address may hold on this node (429 past it); 0 means no limit")
	durationVar(fs, &c.RequestTimeout, "request-timeout", 10*time.Second, "how long a request may take to arrive, headers and body; a connection still waiting for one is closed (a publish is answered 408 first); established streams are not bounded by it")
	fs.IntVar(&c.MaxHeaderBytes, "max-header-bytes", 64<<10, "longest request line and headers, in bytes (431 past it)")
	fs.IntVar(&c.MaxURLBytes, "max-url-bytes", 8<<10, "longest request URL, in bytes (414 past it); at most --max-header-bytes, which counts it too")
	fs.IntVar(&c.AuthFailureBurst, "auth-failure-burst", 20, "failed authentications (invalid tokens) a client address may make at once; past them it is answered 429 before its token is checked; 0 means no limit")
	fs.Float64Var(&c.AuthFailureRate, "auth-failure-rate", 1, "failed authentications per second a client address's bucket refills")
	fs.IntVar(&c.AuthFailureAddresses, "auth-failure-addresses", 65536, "client addresses whose failed authentications this node tracks; past it the least recently seen are forgotten")
	durationVar(fs, &c.Sessions.NegativeTTL, "session-negative-ttl", 10*time.Second, "how long this node remembers a session token PostgreSQL does not know, so its repeats cost no query (Redis is still asked)")
	fs.IntVar(&c.Sessions.NegativeEntries, "session-negative-entries", 65536, "unknown session tokens this node remembers; past it the least recently refused are forgotten")
	fs.IntVar(&c.Sessions.DBQueries, "session-db-queries", 4, "session lookups this node runs in PostgreSQL at once (besides the snapshot reads' 8); one more waits --session-db-wait, then gets 503")
	durationVar(fs, &c.Sessions.DBWait, "session-db-wait", 500*time.Millisecond, "how long a session lookup waits for one of --session-db-queries before it is answered 503 unavailable")
	cf := &c.Conn
	fs.IntVar(&cf.Writers, "writers", 32, "goroutines writing to connections; they never wait for a client (a stalled one's bytes wait on a goroutine of its own), so this bounds CPU only")
	fs.IntVar(&cf.MaxSubscriptions, "max-subscriptions", 200, "tasks plus projects one connection may watch; more are refused with too_many_subscriptions")
	fs.IntVar(&cf.MaxIDs, "max-ids", 100, "tasks plus projects in one request: an SSE URL (400 past it) or a WebSocket subscribe (bad_request)")
	durationVar(fs, &cf.SubscribeTimeout, "subscribe-timeout", 10*time.Second, "longest the initial reads of one subscription may take")
	fs.Float64Var(&cf.SubscribeReads, "subscribe-reads", 50, "snapshot reads per second that one user's subscriptions may cause on this node (one per task id, project or user scope subscribed), refilling a bucket of --subscribe-read-burst; ids past it get rate_limit_exceeded with retry_after and retry_after_ms")
	fs.IntVar(&cf.SubscribeReadBurst, "subscribe-read-burst", 500, "snapshot reads one user's subscriptions may cause at once on this node")
	fs.IntVar(&cf.HotTaskWatchers, "hot-task-watchers", 1000, "connections on this node watching one task by id that make it a hot task, counted in hot_key_detected_total each time a task reaches it (again only after it fell below)")
	fs.Int64Var(&cf.WSMaxMessageBytes, "ws-max-message-bytes", 64<<10, "longest WebSocket message a client may send; a longer one closes the connection with 1009")
	fs.Float64Var(&cf.WSRequestRate, "ws-request-rate", 10, "requests per second one WebSocket may send (token bucket refill); one over it is dropped with rate_limit_exceeded")
	fs.IntVar(&cf.WSRequestBurst, "ws-request-burst", 20, "requests one WebSocket may send at once")
	fs.IntVar(&cf.WSMaxBadMessages, "ws-max-bad-messages", 10, "malformed or dropped WebSocket requests in a row before the connection is closed with 1008")
	fs.Float64Var(&cf.WSControlFrames, "ws-control-frames", 5, "control frames (pings and pongs) one WebSocket client may send per second, in bursts of twice that; one past it closes the connection with 1008")
	fs.IntVar(&cf.SendBuffer, "socket-send-buffer", 256<<10, "each stream's socket send buffer in bytes (SO_SNDBUF): what the kernel holds for a client that stopped reading, before its bytes wait in pushd and its write timeout runs; 0 leaves the kernel's autotuning (up to 4 MB a socket)")
	durationVar(fs, &cf.FirstRequestTimeout, "first-request-timeout", 10*time.Second, "how long a new WebSocket may wait before its first request; then it is closed with 1008")
	a := &c.Admission
	fs.IntVar(&a.UserBurst, "connect-user-burst", 20, "connects a user may make at once (token bucket capacity); 0 means no limit")
	fs.Float64Var(&a.UserRate, "connect-user-rate", 1, "connects per second a user's bucket refills")
	fs.IntVar(&a.IPBurst, "connect-ip-burst", 200, "connects a client IP may make at once; 0 means no limit")
	fs.Float64Var(&a.IPRate, "connect-ip-rate", 20, "connects per second a client IP's bucket refills")
	fs.IntVar(&a.MaxPerUser, "max-conns-per-user", 50, "open connections a user may hold across the fleet; 0 means no cap")
	fs.IntVar(&a.MaxPerTenant, "max-conns-per-tenant", 10000, "open connections a tenant may hold across the fleet; 0 means no cap")
	fs.IntVar(&a.Free, "api-limit-free", 60, "snapshot API calls per tenant and endpoint per --api-window on the free plan; 0 means no limit")
	fs.IntVar(&a.Pro, "api-limit-pro", 600, "the same on the pro plan")
	fs.IntVar(&a.Enterprise, "api-limit-enterprise", 6000, "the same on the enterprise plan")
	fs.StringVar(&a.DefaultPlan, "default-plan", "free", "plan of a tenant that neither its token (plan claim) nor its configuration (tenant:<id> hash, field plan) names")
	durationVar(fs, &a.APIWindow, "api-window", time.Minute, "sliding window of the API limits")
	durationVar(fs, &a.PlanCacheTTL, "plan-cache-ttl", time.Minute, "how long a tenant's configured plan is cached in process")
	durationVar(fs, &a.LeaseTTL, "lease-ttl", 30*time.Second, "how long a connection's lease outlives its node's last renewal")
	durationVar(fs, &a.Renew, "lease-renew-interval", 10*time.Second, "how often a node renews its connections' leases (one pipelined round trip)")
	durationVar(fs, &a.Reconcile, "lease-reconcile-interval", time.Minute, "how often connection counts are rebuilt from live leases")
	fs.IntVar(&a.ExpectedNodes, "expected-nodes", 1, "nodes in the fleet: while the control Redis is down each node allows this share of the caps and API limits")
	durationVar(fs, &a.Timeout, "admission-timeout", 100*time.Millisecond, "longest wait for the control Redis per admission check before local limits decide")
	durationVar(fs, &a.Retry, "admission-retry", time.Second, "after the control Redis failed, how long local limits decide before Redis is tried again")
	durationVar(fs, &a.SessionCheck, "session-check-interval", 10*time.Second, "how often the sessions of open connections are re-validated")
	fs.StringVar(&c.LogLevel, "log-level", "info", "debug, info, warn or error")
	fs.StringVar(&c.LogFormat, "log-format", "text", "text or json")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), `Usage: pushd [flags]
       pushd version
       pushd token [flags]         mint a token (pushd token -h)
       pushd token verify [TOKEN]  check a token as this node would

Every flag can also be set by its environment variable, or as
"name = value" in the --config file. A flag wins over the environment,
which wins over the file.

`)
		fs.VisitAll(func(f *flag.Flag) {
			fmt.Fprintf(fs.Output(), "  --%s (%s)\n    \t%s", f.Name, envName(f.Name), f.Usage)
			if f.DefValue != "" {
				fmt.Fprintf(fs.Output(), " (default %q)", f.DefValue)
			}
			fmt.Fprintln(fs.Output())
		})
	}
	return fs
}

// parseConfig reads the settings: flags, then their PUSHD_* twins for what
// the flags left unset, then the --config file for what both left, then
// defaults. Every value is validated; the error names each bad setting and
// where its value came from, and is a usageError. -h prints the usage on
// stdout and returns flag.ErrHelp.
func parseConfig(args, environ []string, stdout io.Writer) (config, error) {
	var c config
	fs := newFlagSet(&c)
	if err := parseArgs(fs, args, stdout); err != nil {
		return c, err
	}
	if fs.NArg() > 0 {
		if guess := closest(fs.Arg(0), []string{"token", "version"}); guess != "" && fs.NArg() == len(args) {
			return c, usageErrorf("unknown command %q; did you mean %s? (run pushd -h)", fs.Arg(0), guess)
		}
		return c, usageErrorf("unexpected argument %q (run pushd -h for the flags)", fs.Arg(0))
	}
	if err := c.load(fs, newEnvironment(environ)); err != nil {
		return c, usageError{err}
	}
	return c, nil
}

// load completes a command line fs has parsed into c: the environment and
// the config file fill in the settings it left unset, the secret files are
// read, and everything is validated. It reports every bad setting at once.
// Only the node's settings are read from the environment and the file, so a
// command's own flags (pushd token's --tenant) have no twins.
func (c *config) load(fs *flag.FlagSet, env environment) error {
	from := origins{}
	c.from = from
	fs.Visit(func(f *flag.Flag) { from[f.Name] = fromFlag })

	settings := newFlagSet(&config{})
	c.warnings = env.unknownVariables(settings)
	var errs []error
	settings.VisitAll(func(f *flag.Flag) {
		v := env[envName(f.Name)]
		if _, set := from[f.Name]; set || v == "" {
			return
		}
		from[f.Name] = envName(f.Name)
		if err := fs.Set(f.Name, v); err != nil {
			errs = append(errs, from.settingError(f.Name, "invalid value %q: %v", v, err))
		}
	})
	if c.ConfigFile != "" {
		errs = append(errs, applyConfigFile(fs, c.ConfigFile, from)...)
	}
	errs = append(errs, c.readSecretFile("jwt-secret", &c.JWTSecret, c.JWTSecretFile, from))
	errs = append(errs, c.readSecretFile("api-key", &c.APIKey, c.APIKeyFile, from))
	errs = append(errs, c.readPublicKey(from))
	if c.NodeName == "" {
		c.NodeName, _ = os.Hostname()
	}
	// A setting that failed to parse kept its default, which validate
	// passes, so its errors are the other settings'.
	errs = append(errs, c.validate(from))
	if n := len(c.JWTSecret); n > 0 && n < minSecretBytes {
		c.warnings = append(c.warnings, warning{"HS256 secret shorter than 32 bytes: a short secret can be guessed, and whoever guesses it mints tokens",
			[]any{"setting", "jwt-secret", "from", from.of("jwt-secret"), "bytes", n}})
	}
	return errors.Join(errs...)
}

// minSecretBytes is the shortest HS256 secret pushd takes without a
// warning: as many bytes as the hash, as RFC 7518 requires.
const minSecretBytes = 32

// readSecretFile sets *value from the file the name-file setting names,
// less one trailing newline, which editors and echo add.
func (c *config) readSecretFile(name string, value *string, path string, from origins) error {
	if path == "" {
		return nil
	}
	if *value != "" {
		return from.settingError(name+"-file", "set --%s (from %s) or --%s-file, not both", name, from.of(name), name)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return from.settingError(name+"-file", "%v", err)
	}
	s := strings.TrimSuffix(strings.TrimSuffix(string(b), "\n"), "\r")
	if s == "" {
		return from.settingError(name+"-file", "%s is empty", path)
	}
	*value = s
	from[name] = "the file " + path
	return nil
}

// applyConfigFile sets, from the file, every flag the command line and
// the environment left unset. A line they override is still parsed, so a
// bad value fails now rather than the day the override goes away.
func applyConfigFile(fs *flag.FlagSet, path string, from origins) []error {
	settings, err := readConfigFile(path)
	if err != nil {
		return []error{from.settingError("config", "%v", err)}
	}
	check := newFlagSet(&config{})
	var errs []error
	for _, s := range settings {
		where := fmt.Sprintf("%s:%d", path, s.line)
		if fs.Lookup(s.name) == nil || s.name == "config" {
			errs = append(errs, fmt.Errorf("%s: unknown setting %q%s", where, s.name, settingHint(fs, s.name)))
			continue
		}
		target := fs
		if _, set := from[s.name]; set {
			target = check
		} else {
			from[s.name] = where
		}
		if err := target.Set(s.name, s.value); err != nil {
			errs = append(errs, fmt.Errorf("--%s (from %s): invalid value %q: %v", s.name, where, s.value, err))
		}
	}
	return errs
}

// settingHint suggests the key a user probably meant.
func settingHint(fs *flag.FlagSet, name string) string {
	if name == "config" {
		return " (a config file cannot name another)"
	}
	guess := strings.ToLower(strings.ReplaceAll(strings.TrimLeft(strings.TrimPrefix(name, "PUSHD_"), "-"), "_", "-"))
	if guess != name && fs.Lookup(guess) != nil && guess != "config" {
		return fmt.Sprintf(" (keys are flag names: %s)", guess)
	}
	return ""
}

// Embedded reports whether the node runs without Redis and PostgreSQL.
func (c config) Embedded() bool { return c.RedisURL == "" && c.DatabaseURL == "" }

// trustedProxies parses --trusted-proxies: CIDRs, or single addresses.
func (c config) trustedProxies() ([]*net.IPNet, error) {
	var out []*net.IPNet
	for item := range strings.SplitSeq(c.TrustedProxies, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		cidr := item
		if !strings.Contains(cidr, "/") { // one address
			if strings.Contains(cidr, ":") {
				cidr += "/128"
			} else {
				cidr += "/32"
			}
		}
		_, n, err := net.ParseCIDR(cidr)
		if err != nil {
			return nil, fmt.Errorf("%q: want IP addresses or CIDRs", item)
		}
		out = append(out, n)
	}
	return out, nil
}

// readPublicKey reads --jwt-public-key's file into c.jwtPEM. Only a
// regular file: a FIFO or a device would block the start.
func (c *config) readPublicKey(from origins) error {
	if c.JWTPublicKey == "" {
		return nil
	}
	st, err := os.Stat(c.JWTPublicKey)
	if err == nil && !st.Mode().IsRegular() {
		err = fmt.Errorf("%s is not a regular file", c.JWTPublicKey)
	}
	if err == nil {
		c.jwtPEM, err = os.ReadFile(c.JWTPublicKey)
	}
	if err != nil {
		return from.settingError("jwt-public-key", "%v", err)
	}
	return nil
}

// nodeConfig is the node's Config of these settings.
func (c config) nodeConfig(version string, log *slog.Logger) node.Config {
	proxies, _ := c.trustedProxies() // validated with the other settings
	return node.Config{
		RedisURL: c.RedisURL, RedisCluster: c.RedisCluster, KeyPrefix: c.KeyPrefix, DatabaseURL: c.DatabaseURL,
		RedisCacheURL: c.RedisCacheURL, RedisControlURL: c.RedisControlURL, RedisRealtimeURL: c.RedisRealtimeURL,
		JWTSecret: []byte(c.JWTSecret), JWTPublicKeyPEM: c.jwtPEM, JWTAlgorithm: c.JWTAlgorithm,
		JWTAudience: c.jwtAudience(), JWTIssuer: c.JWTIssuer, JWTMaxTTL: c.JWTMaxTTL,
		APIKey: c.APIKey, NodeName: c.NodeName, Version: version, OriginPatterns: c.originPatterns(), TrustedProxies: proxies,
		Heartbeat: c.Heartbeat, PollInterval: c.PollInterval, WriteTimeout: c.WriteTimeout, SSERetry: c.Retry,
		ReconnectAfter: c.ReconnectAfter, Demo: c.Demo, Logger: log,
		Streams: c.Streams, StreamMaxLen: c.StreamMaxLen, StreamClusterReads: c.StreamReads,
		AnnounceReconcileInterval: c.AnnounceRepair, RepairInterval: c.RepairInterval,
		Admission: c.Admission.config(), Sessions: c.Sessions.config(),
		MaxConns: maxConns(c.MaxConns), MaxConnsPerIP: c.MaxConnsPerIP,
		RequestTimeout: c.RequestTimeout, MaxHeaderBytes: c.MaxHeaderBytes, MaxURLBytes: c.MaxURLBytes,
		Writers: c.Conn.Writers, MaxSubscriptions: c.Conn.MaxSubscriptions, MaxIDs: c.Conn.MaxIDs,
		SubscribeTimeout: c.Conn.SubscribeTimeout, SubscribeReads: c.Conn.SubscribeReads, SubscribeReadBurst: c.Conn.SubscribeReadBurst,
		WSMaxMessageBytes: c.Conn.WSMaxMessageBytes, WSRequestRate: c.Conn.WSRequestRate, WSRequestBurst: c.Conn.WSRequestBurst, WSControlFrames: c.Conn.WSControlFrames,
		WSMaxBadMessages: c.Conn.WSMaxBadMessages, FirstRequestTimeout: c.Conn.FirstRequestTimeout, SendBuffer: c.Conn.SendBuffer,
		HotTaskWatchers:  c.Conn.HotTaskWatchers,
		AuthFailureBurst: c.AuthFailureBurst, AuthFailureRate: c.AuthFailureRate, AuthFailureAddresses: c.AuthFailureAddresses,
	}
}

// jwtAudience parses --jwt-audience.
func (c config) jwtAudience() []string {
	var out []string
	for a := range strings.SplitSeq(c.JWTAudience, ",") {
		if a = strings.TrimSpace(a); a != "" {
			out = append(out, a)
		}
	}
	return out
}

func (c config) originPatterns() []string {
	var out []string
	for o := range strings.SplitSeq(c.Origins, ",") {
		if o = strings.TrimSpace(o); o != "" {
			out = append(out, o)
		}
	}
	return out
}

// config is the session.Config of the flags; the node adds its stores.
func (s sessionFlags) config() session.Config {
	return session.Config{NegativeTTL: s.NegativeTTL, NegativeEntries: s.NegativeEntries, MaxDBQueries: s.DBQueries, DBQueueWait: s.DBWait}
}

// config is the admission.Config of the flags; the node adds its Redis.
func (a admissionFlags) config() admission.Config {
	return admission.Config{
		ConnectUserBurst: a.UserBurst, ConnectUserRate: a.UserRate,
		ConnectIPBurst: a.IPBurst, ConnectIPRate: a.IPRate,
		MaxConnsPerUser: a.MaxPerUser, MaxConnsPerTenant: a.MaxPerTenant,
		Plans:       map[string]int{admission.PlanFree: a.Free, admission.PlanPro: a.Pro, admission.PlanEnterprise: a.Enterprise},
		DefaultPlan: a.DefaultPlan, APIWindow: a.APIWindow, PlanCacheTTL: a.PlanCacheTTL,
		LeaseTTL: a.LeaseTTL, RenewInterval: a.Renew, ReconcileInterval: a.Reconcile,
		ExpectedNodes: a.ExpectedNodes, Timeout: a.Timeout, RetryAfterFailure: a.Retry,
		SessionCheckInterval: a.SessionCheck,
	}
}
