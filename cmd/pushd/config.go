package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/pushd/pushd/admission"
	"github.com/pushd/pushd/node"
)

// config is every setting of a node. Each flag has a PUSHD_* environment
// twin and a key in the optional config file; precedence is flag, then
// environment, then file, then default.
type config struct {
	// Node holds every setting the node takes as it is, each flag bound
	// straight to its field; its defaults are node.DefaultConfig's.
	Node node.Config

	// What the node takes parsed, or the command alone uses.
	ConfigFile     string
	Listen         string
	JWTSecret      string
	JWTSecretFile  string
	JWTPublicKey   string
	JWTAudience    string
	APIKeyFile     string
	Origins        string
	TrustedProxies string
	DrainTimeout   time.Duration
	DebugListen    string
	AdminListen    string
	LogLevel       string
	LogFormat      string

	// warnings are what the start logs and goes on: unknown PUSHD_*
	// variables, a short secret.
	warnings []warning
	from     origins // where each setting came from, for messages
	jwtPEM   []byte  // --jwt-public-key's file, read by load
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

// newFlagSet defines every setting on c. A flag's default is the value
// its field holds in node.DefaultConfig, which the components' packages
// give it (a test holds them together); -h, docs/CONFIG.md (checked by a
// test) and the config file all read the defaults from the flag set.
func newFlagSet(c *config) *flag.FlagSet {
	c.Node = node.DefaultConfig()
	n := &c.Node
	fs := flag.NewFlagSet("pushd", flag.ContinueOnError)
	fs.SetOutput(io.Discard) // parseArgs words the errors and prints -h
	fs.StringVar(&c.ConfigFile, "config", "", "file of settings, one \"name = value\" a line (names are the flags'); flags and the environment win over it")
	fs.StringVar(&c.Listen, "listen", ":8080", "address to serve")
	fs.StringVar(&n.RedisURL, "redis-url", "", "Redis URL (redis://host:port/db); empty with no database URL runs the embedded mode")
	fs.BoolVar(&n.RedisCluster, "redis-cluster", false, "--redis-url lists seed nodes of a Redis Cluster, comma-separated; notifications travel on sharded Pub/Sub")
	fs.StringVar(&n.KeyPrefix, "key-prefix", "", "prefix of every Redis key and channel, for sharing one Redis between environments; with --redis-cluster it must hold no { or }")
	fs.StringVar(&n.DatabaseURL, "database-url", "", "PostgreSQL URL (pgx), the fallback and fact source behind Redis")
	fs.StringVar(&c.JWTSecret, "jwt-secret", "", "HS256 secret for client tokens; at least 32 random bytes (a shorter one is warned of)")
	fs.StringVar(&c.JWTSecretFile, "jwt-secret-file", "", "file holding --jwt-secret, one trailing newline trimmed (for secrets mounted as files); set one of the two")
	fs.StringVar(&c.JWTPublicKey, "jwt-public-key", "", "PEM file of the RS256, ES256 or EdDSA public key for client tokens")
	fs.StringVar(&n.JWTAlgorithm, "jwt-algorithm", "", "pin the token algorithm (HS256, RS256, ES256, EdDSA); default from the key")
	fs.StringVar(&c.JWTAudience, "jwt-audience", "", "comma-separated audiences: a token's aud claim must name one of them (401 otherwise); empty checks no audience")
	fs.StringVar(&n.JWTIssuer, "jwt-issuer", "", "the iss claim every token must carry (401 otherwise); empty checks no issuer")
	durationVar(fs, &n.JWTMaxTTL, "jwt-max-ttl", "longest lifetime a token may claim, exp - iat (exp - now when it has no iat); a longer one is refused with 401, and pushd token mints within it")
	fs.StringVar(&n.APIKey, "api-key", "", "key for POST /v1/publish (X-API-Key); empty allows loopback callers only")
	fs.StringVar(&c.APIKeyFile, "api-key-file", "", "file holding --api-key, one trailing newline trimmed; set one of the two")
	fs.StringVar(&n.NodeName, "node-name", "", "name shown in hello and metrics; empty means the host name")
	fs.StringVar(&c.TrustedProxies, "trusted-proxies", "", "comma-separated addresses or CIDRs of load balancers whose X-Forwarded-For names the client for the per-address limits; empty trusts none")
	fs.StringVar(&c.Origins, "allowed-origins", "", "comma-separated origin patterns (host or scheme://host, with * wildcards) whose pages may open WebSockets and use the token cookie, besides the server's own host; other origins get 403")
	durationVar(fs, &n.Hub.HeartbeatInterval, "heartbeat", "idle time after which a heartbeat is written")
	durationVar(fs, &n.Hub.PollInterval, "poll-interval", "while Pub/Sub is down, how often watched tasks are re-read (jittered)")
	durationVar(fs, &n.Hub.WriteTimeout, "write-timeout", "a client slower than this per write is disconnected")
	durationVar(fs, &n.SSE.Retry, "sse-retry", "base SSE reconnect delay (each connection adds up to 50% jitter)")
	c.DrainTimeout = 10 * time.Second
	durationVar(fs, &c.DrainTimeout, "drain-timeout", "how long shutdown spends closing connections")
	durationVar(fs, &n.ReconnectAfter, "reconnect-after", "clients of a draining node reconnect after a random delay up to this")
	fs.BoolVar(&n.Streams, "streams", false, "also append every change to the tenant's Redis Stream, tail the streams to close Pub/Sub gaps, and resume SSE clients from stream cursors")
	fs.Int64Var(&n.StreamMaxLen, "stream-maxlen", n.StreamMaxLen, "with --streams, trim each tenant's stream to about this many entries (XADD MAXLEN ~)")
	fs.IntVar(&n.Stream.ClusterReads, "stream-cluster-reads", n.Stream.ClusterReads, "with --streams on Redis Cluster, blocking stream reads (one per watched tenant, each on a connection of its own) this node keeps open on each master; the tenants past it are polled every second")
	durationVar(fs, &n.Reconcile.Interval, "announce-reconcile-interval", "on Redis Cluster or with the cache and realtime roles apart, how often (jittered) this node announces the stored snapshots of watched tenants whose publisher died before announcing them")
	durationVar(fs, &n.Hub.RepairInterval, "repair-interval", "how often every watched task is checked against Redis and PostgreSQL (one node of the fleet per task), so a change written and never announced reaches its watchers within this plus 1s; finished tasks every 10th time")
	fs.StringVar(&c.DebugListen, "debug-listen", "", "address for net/http/pprof (e.g. 127.0.0.1:6060); empty serves none; keep it private")
	fs.StringVar(&c.AdminListen, "admin-listen", "127.0.0.1:9464", "address of the admin listener: /metrics (Prometheus), /healthz and /readyz; empty serves none; keep it private (the client listener never serves /metrics)")
	fs.BoolVar(&n.Demo, "demo", false, "serve the demo page and its task simulator at /demo/ (the embedded mode always does); with a configured secret or key the page asks for a token; with a database the simulator writes generation_tasks rows, as a Task State Service would")
	fs.StringVar(&n.RedisCacheURL, "redis-cache-url", "", "Redis for task snapshots; empty means --redis-url")
	fs.StringVar(&n.RedisControlURL, "redis-control-url", "", "Redis for rate limits, connection leases and sessions; empty means --redis-url")
	fs.StringVar(&n.RedisRealtimeURL, "redis-realtime-url", "", "Redis for Pub/Sub and streams; empty means --redis-url")
	api := &n.API
	fs.IntVar(&api.MaxConns, "max-conns", api.MaxConns, "streams this node holds before it answers 503; 0 means the open-file limit less 1,000 kept for Redis, PostgreSQL and requests")
	fs.IntVar(&api.MaxConnsPerIP, "max-conns-per-ip", api.MaxConnsPerIP, "streams one client address may hold on this node (429 past it); 0 means no limit")
	durationVar(fs, &n.RequestTimeout, "request-timeout", "how long a request may take to arrive, headers and body; a connection still waiting for one is closed (a publish is answered 408 first); established streams are not bounded by it")
	fs.IntVar(&n.MaxHeaderBytes, "max-header-bytes", n.MaxHeaderBytes, "longest request line and headers, in bytes (431 past it)")
	fs.IntVar(&api.MaxURLBytes, "max-url-bytes", api.MaxURLBytes, "longest request URL, in bytes (414 past it); at most --max-header-bytes, which counts it too")
	fs.IntVar(&api.AuthFailureBurst, "auth-failure-burst", api.AuthFailureBurst, "failed authentications (invalid tokens) a client address may make at once; past them it is answered 429 before its token is checked; 0 means no limit")
	fs.Float64Var(&api.AuthFailureRate, "auth-failure-rate", api.AuthFailureRate, "failed authentications per second a client address's bucket refills")
	fs.IntVar(&api.AuthFailureAddresses, "auth-failure-addresses", api.AuthFailureAddresses, "client addresses whose failed authentications this node tracks; past it the least recently seen are forgotten")
	ss := &n.Sessions
	durationVar(fs, &ss.NegativeTTL, "session-negative-ttl", "how long this node remembers a session token PostgreSQL does not know, so its repeats cost no query (Redis is still asked)")
	fs.IntVar(&ss.NegativeEntries, "session-negative-entries", ss.NegativeEntries, "unknown session tokens this node remembers; past it the least recently refused are forgotten")
	fs.IntVar(&ss.MaxDBQueries, "session-db-queries", ss.MaxDBQueries, "session lookups this node runs in PostgreSQL at once (besides the snapshot reads' 8); one more waits --session-db-wait, then gets 503")
	durationVar(fs, &ss.DBQueueWait, "session-db-wait", "how long a session lookup waits for one of --session-db-queries before it is answered 503 unavailable")
	h := &n.Hub
	fs.IntVar(&h.Writers, "writers", h.Writers, "goroutines writing to connections; they never wait for a client (a stalled one's bytes wait on a goroutine of its own), so this bounds CPU only")
	fs.IntVar(&h.MaxSubscriptions, "max-subscriptions", h.MaxSubscriptions, "tasks plus projects one connection may watch; more are refused with too_many_subscriptions")
	fs.IntVar(&h.MaxIDs, "max-ids", h.MaxIDs, "tasks plus projects in one request: an SSE URL (400 past it) or a WebSocket subscribe (bad_request)")
	durationVar(fs, &h.SubscribeTimeout, "subscribe-timeout", "longest the initial reads of one subscription may take")
	fs.Float64Var(&h.SubscribeReads, "subscribe-reads", h.SubscribeReads, "snapshot reads per second that one user's subscriptions may cause on this node (one per task id, project or user scope subscribed), refilling a bucket of --subscribe-read-burst; ids past it get rate_limit_exceeded with retry_after and retry_after_ms")
	fs.IntVar(&h.SubscribeReadBurst, "subscribe-read-burst", h.SubscribeReadBurst, "snapshot reads one user's subscriptions may cause at once on this node")
	fs.IntVar(&h.HotTaskWatchers, "hot-task-watchers", h.HotTaskWatchers, "connections on this node watching one task by id that make it a hot task, counted in hot_key_detected_total each time a task reaches it (again only after it fell below)")
	fs.IntVar(&h.SendBuffer, "socket-send-buffer", h.SendBuffer, "each stream's socket send buffer in bytes (SO_SNDBUF): what the kernel holds for a client that stopped reading, before its bytes wait in pushd and its write timeout runs; 0 leaves the kernel's autotuning (up to 4 MB a socket)")
	w := &n.WS
	fs.Int64Var(&w.ReadLimit, "ws-max-message-bytes", w.ReadLimit, "longest WebSocket message a client may send; a longer one closes the connection with 1009")
	fs.Float64Var(&w.RequestRate, "ws-request-rate", w.RequestRate, "requests per second one WebSocket may send (token bucket refill); one over it is dropped with rate_limit_exceeded")
	fs.IntVar(&w.RequestBurst, "ws-request-burst", w.RequestBurst, "requests one WebSocket may send at once")
	fs.IntVar(&w.MaxBadMessages, "ws-max-bad-messages", w.MaxBadMessages, "malformed or dropped WebSocket requests in a row before the connection is closed with 1008")
	fs.Float64Var(&w.ControlFrames, "ws-control-frames", w.ControlFrames, "control frames (pings and pongs) one WebSocket client may send per second, in bursts of twice that; one past it closes the connection with 1008")
	durationVar(fs, &w.FirstRequestTimeout, "first-request-timeout", "how long a new WebSocket may wait before its first request; then it is closed with 1008")
	a := &n.Admission
	fs.IntVar(&a.ConnectUserBurst, "connect-user-burst", a.ConnectUserBurst, "connects a user may make at once (token bucket capacity); 0 means no limit")
	fs.Float64Var(&a.ConnectUserRate, "connect-user-rate", a.ConnectUserRate, "connects per second a user's bucket refills")
	fs.IntVar(&a.ConnectIPBurst, "connect-ip-burst", a.ConnectIPBurst, "connects a client IP may make at once; 0 means no limit")
	fs.Float64Var(&a.ConnectIPRate, "connect-ip-rate", a.ConnectIPRate, "connects per second a client IP's bucket refills")
	fs.IntVar(&a.MaxConnsPerUser, "max-conns-per-user", a.MaxConnsPerUser, "open connections a user may hold across the fleet; 0 means no cap")
	fs.IntVar(&a.MaxConnsPerTenant, "max-conns-per-tenant", a.MaxConnsPerTenant, "open connections a tenant may hold across the fleet; 0 means no cap")
	fs.Var(planLimit{a.Plans, admission.PlanFree}, "api-limit-free", "snapshot API calls per tenant and endpoint per --api-window on the free plan; 0 means no limit")
	fs.Var(planLimit{a.Plans, admission.PlanPro}, "api-limit-pro", "the same on the pro plan")
	fs.Var(planLimit{a.Plans, admission.PlanEnterprise}, "api-limit-enterprise", "the same on the enterprise plan")
	fs.StringVar(&a.DefaultPlan, "default-plan", a.DefaultPlan, "plan of a tenant that neither its token (plan claim) nor its configuration (tenant:<id> hash, field plan) names")
	durationVar(fs, &a.APIWindow, "api-window", "sliding window of the API limits")
	durationVar(fs, &a.PlanCacheTTL, "plan-cache-ttl", "how long a tenant's configured plan is cached in process")
	durationVar(fs, &a.LeaseTTL, "lease-ttl", "how long a connection's lease outlives its node's last renewal")
	durationVar(fs, &a.RenewInterval, "lease-renew-interval", "how often a node renews its connections' leases (one pipelined round trip)")
	durationVar(fs, &a.ReconcileInterval, "lease-reconcile-interval", "how often connection counts are rebuilt from live leases")
	fs.IntVar(&a.ExpectedNodes, "expected-nodes", a.ExpectedNodes, "nodes in the fleet: while the control Redis is down each node allows this share of the caps and API limits")
	durationVar(fs, &a.Timeout, "admission-timeout", "longest wait for the control Redis per admission check before local limits decide")
	durationVar(fs, &a.RetryAfterFailure, "admission-retry", "after the control Redis failed, how long local limits decide before Redis is tried again")
	durationVar(fs, &a.SessionCheckInterval, "session-check-interval", "how often the sessions of open connections are re-validated")
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
	errs = append(errs, c.readSecretFile("api-key", &c.Node.APIKey, c.APIKeyFile, from))
	errs = append(errs, c.readPublicKey(from))
	if c.Node.NodeName == "" {
		c.Node.NodeName, _ = os.Hostname()
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
func (c config) Embedded() bool { return c.Node.Embedded() }

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
	n := c.Node
	n.JWTSecret, n.JWTPublicKeyPEM, n.JWTAudience = []byte(c.JWTSecret), c.jwtPEM, c.jwtAudience()
	n.API.TrustedProxies, _ = c.trustedProxies() // validated with the other settings
	n.API.OriginPatterns = c.originPatterns()
	n.API.MaxConns = maxConns(n.API.MaxConns)
	n.Version, n.Logger = version, log
	return n
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

// planLimit is the flag of one plan's API limit, an entry of
// admission.Config.Plans.
type planLimit struct {
	plans map[string]int
	plan  string
}

func (p planLimit) String() string {
	if p.plans == nil { // the flag package's zero value, for -h
		return "0"
	}
	return strconv.Itoa(p.plans[p.plan])
}

func (p planLimit) Set(s string) error {
	n, err := strconv.ParseInt(s, 0, strconv.IntSize)
	if err != nil {
		return errors.New("parse error")
	}
	p.plans[p.plan] = int(n)
	return nil
}
