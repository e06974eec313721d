package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"
)

// config is every setting of a node. Each flag has a PUSHD_* environment
// twin; a flag on the command line wins over its twin.
type config struct {
	Listen         string
	RedisURL       string
	KeyPrefix      string
	DatabaseURL    string
	JWTSecret      string
	JWTPublicKey   string
	JWTAlgorithm   string
	APIKey         string
	NodeName       string
	Origins        string
	Heartbeat      time.Duration
	PollInterval   time.Duration
	WriteTimeout   time.Duration
	Retry          time.Duration
	DrainTimeout   time.Duration
	ReconnectAfter time.Duration
	DebugListen    string
	Streams        bool
	StreamMaxLen   int64
	Demo           bool
	LogLevel       string
	LogFormat      string
}

// envName is a flag's environment twin: --redis-url is PUSHD_REDIS_URL.
func envName(flagName string) string {
	return "PUSHD_" + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

func parseConfig(args []string, getenv func(string) string, stderr io.Writer) (config, error) {
	host, _ := os.Hostname()
	var c config
	fs := flag.NewFlagSet("pushd", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&c.Listen, "listen", ":8080", "address to serve")
	fs.StringVar(&c.RedisURL, "redis-url", "", "Redis URL (redis://host:port/db); empty with no database URL runs the embedded mode")
	fs.StringVar(&c.KeyPrefix, "key-prefix", "", "prefix of every Redis key and channel, for sharing one Redis between environments")
	fs.StringVar(&c.DatabaseURL, "database-url", "", "PostgreSQL URL (pgx), the fallback and fact source behind Redis")
	fs.StringVar(&c.JWTSecret, "jwt-secret", "", "HS256 secret for client tokens")
	fs.StringVar(&c.JWTPublicKey, "jwt-public-key", "", "PEM file of the RS256, ES256 or EdDSA public key for client tokens")
	fs.StringVar(&c.JWTAlgorithm, "jwt-algorithm", "", "pin the token algorithm (HS256, RS256, ES256, EdDSA); default from the key")
	fs.StringVar(&c.APIKey, "api-key", "", "key for POST /v1/publish (X-API-Key); empty allows loopback callers only")
	fs.StringVar(&c.NodeName, "node-name", host, "name shown in hello and metrics")
	fs.StringVar(&c.Origins, "allowed-origins", "", "comma-separated origin patterns allowed to open WebSockets besides the server's own host")
	fs.DurationVar(&c.Heartbeat, "heartbeat", 25*time.Second, "idle time after which a heartbeat is written")
	fs.DurationVar(&c.PollInterval, "poll-interval", 2*time.Second, "while Pub/Sub is down, how often watched tasks are re-read (jittered)")
	fs.DurationVar(&c.WriteTimeout, "write-timeout", 10*time.Second, "a client slower than this per write is disconnected")
	fs.DurationVar(&c.Retry, "sse-retry", 2*time.Second, "base SSE reconnect delay (each connection adds up to 50% jitter)")
	fs.DurationVar(&c.DrainTimeout, "drain-timeout", 10*time.Second, "how long shutdown spends closing connections")
	fs.DurationVar(&c.ReconnectAfter, "reconnect-after", 5*time.Second, "clients of a draining node reconnect after a random delay up to this")
	fs.BoolVar(&c.Streams, "streams", false, "also append every change to the tenant's Redis Stream, tail the streams to close Pub/Sub gaps, and resume SSE clients from stream cursors")
	fs.Int64Var(&c.StreamMaxLen, "stream-maxlen", 10000, "with --streams, trim each tenant's stream to about this many entries (XADD MAXLEN ~)")
	fs.StringVar(&c.DebugListen, "debug-listen", "", "address for net/http/pprof (e.g. 127.0.0.1:6060); empty serves none; keep it private")
	fs.BoolVar(&c.Demo, "demo", false, "serve the demo page and its task simulator at /demo/ (the embedded mode always does); with a configured secret or key the page asks for a token")
	fs.StringVar(&c.LogLevel, "log-level", "info", "debug, info, warn or error")
	fs.StringVar(&c.LogFormat, "log-format", "text", "text or json")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: pushd [flags]\n\nEvery flag can also be set by its environment variable.\n\n")
		fs.VisitAll(func(f *flag.Flag) {
			fmt.Fprintf(fs.Output(), "  --%s (%s)\n    \t%s", f.Name, envName(f.Name), f.Usage)
			if f.DefValue != "" {
				fmt.Fprintf(fs.Output(), " (default %q)", f.DefValue)
			}
			fmt.Fprintln(fs.Output())
		})
	}
	var envErr error
	fs.VisitAll(func(f *flag.Flag) {
		if v := getenv(envName(f.Name)); v != "" && envErr == nil {
			if err := fs.Set(f.Name, v); err != nil {
				envErr = fmt.Errorf("%s: %w", envName(f.Name), err)
			}
		}
	})
	if envErr != nil {
		return c, envErr
	}
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	if fs.NArg() > 0 {
		return c, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	if c.JWTSecret != "" && c.JWTPublicKey != "" {
		return c, fmt.Errorf("set --jwt-secret or --jwt-public-key, not both")
	}
	if c.DatabaseURL != "" && c.RedisURL == "" {
		return c, fmt.Errorf("--database-url needs --redis-url (set neither for the embedded mode)")
	}
	if c.Streams && c.RedisURL == "" {
		return c, fmt.Errorf("--streams needs --redis-url")
	}
	if c.StreamMaxLen <= 0 {
		return c, fmt.Errorf("--stream-maxlen must be positive")
	}
	return c, nil
}

// Embedded reports whether the node runs without Redis and PostgreSQL.
func (c config) Embedded() bool { return c.RedisURL == "" && c.DatabaseURL == "" }

func (c config) originPatterns() []string {
	var out []string
	for o := range strings.SplitSeq(c.Origins, ",") {
		if o = strings.TrimSpace(o); o != "" {
			out = append(out, o)
		}
	}
	return out
}
