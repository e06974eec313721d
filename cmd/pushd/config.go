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

	"github.com/pushd/pushd/internal/flagval"
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
	AdminHosts     string
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
// A setting that kept its default names no origin: what is wrong with it
// is that it was not set.
func (o origins) settingError(name, format string, args ...any) error {
	if _, set := o[name]; !set {
		return fmt.Errorf("--%s: %s", name, fmt.Sprintf(format, args...))
	}
	return fmt.Errorf("--%s (from %s): %s", name, o.of(name), fmt.Sprintf(format, args...))
}

// nodeFlags names the node's flag set: the one -h all lists in groups.
const nodeFlags = "pushd"

// newFlagSet defines every setting on c: the node's and its components'
// are theirs (node.Config.RegisterFlags: name, default and help beside
// the field), the few that take parsing or only the command uses are
// here. -h, docs/CONFIG.md (checked by a test) and the config file all
// read the defaults from the flag set.
func newFlagSet(c *config) *flag.FlagSet {
	fs := flag.NewFlagSet(nodeFlags, flag.ContinueOnError)
	fs.SetOutput(io.Discard) // parseArgs words the errors and prints -h
	c.Node = node.DefaultConfig()
	c.Node.RegisterFlags(fs)
	fs.StringVar(&c.ConfigFile, "config", "", "file of settings, one \"name = value\" a line (names are the flags'); flags and the environment win over it")
	fs.StringVar(&c.Listen, "listen", ":8080", "address to serve")
	fs.StringVar(&c.JWTSecret, "jwt-secret", "", "HS256 secret for client tokens; at least 32 random bytes (a shorter one is warned of)")
	fs.StringVar(&c.JWTSecretFile, "jwt-secret-file", "", "file holding --jwt-secret, one trailing newline trimmed (for secrets mounted as files); set one of the two")
	fs.StringVar(&c.JWTPublicKey, "jwt-public-key", "", "PEM file of the RS256, ES256 or EdDSA public key for client tokens")
	fs.StringVar(&c.JWTAudience, "jwt-audience", "", "comma-separated audiences: a token's aud claim must name one of them (401 otherwise); empty checks no audience")
	fs.StringVar(&c.APIKeyFile, "api-key-file", "", "file holding --api-key, one trailing newline trimmed; set one of the two")
	fs.StringVar(&c.TrustedProxies, "trusted-proxies", "", "comma-separated addresses or CIDRs of load balancers whose X-Forwarded-For names the client for the per-address limits; empty trusts none")
	fs.StringVar(&c.Origins, "allowed-origins", "", "comma-separated origin patterns (host or scheme://host, with * wildcards) whose pages may stream (SSE and WebSocket), read snapshots with fetch and use the token cookie, besides the server's own host; other origins get 403 or no CORS headers")
	c.DrainTimeout = 10 * time.Second
	flagval.Duration(fs, &c.DrainTimeout, "drain-timeout", "how long shutdown spends closing connections")
	fs.StringVar(&c.DebugListen, "debug-listen", "", "address for net/http/pprof (e.g. 127.0.0.1:6060); empty serves none; keep it private; a request must arrive within --request-timeout, and a profile or trace last under 2 minutes")
	fs.StringVar(&c.AdminListen, "admin-listen", "127.0.0.1:9464", "address of the admin listener: /metrics (Prometheus), /healthz, /readyz and the delivery inspector /inspect/tasks/{id}; empty serves none; keep it private (the client listener never serves /metrics or the inspector, which names users and connections)")
	fs.StringVar(&c.AdminHosts, "admin-hosts", "", "comma-separated DNS names the admin and debug listeners answer to besides IP addresses and localhost, e.g. pushd-admin.monitoring.svc for a scrape by Service name; a request whose Host is any other name gets 403 host_not_allowed on every route, so a web page that DNS-rebinds its own name to the listener reads nothing; empty lists none")
	fs.StringVar(&c.LogLevel, "log-level", "info", "debug, info, warn or error")
	fs.StringVar(&c.LogFormat, "log-format", "text", "text or json")
	fs.Usage = func() { printUsage(fs.Output(), fs, false) }
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
		if guess := closest(fs.Arg(0), []string{"migrate", "token", "version"}); guess != "" && fs.NArg() == len(args) {
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
	n.AdminHosts = c.adminHosts()
	n.Version, n.Logger = version, log
	return n
}

// jwtAudience parses --jwt-audience.
func (c config) jwtAudience() []string { return commaList(c.JWTAudience) }

// originPatterns parses --allowed-origins.
func (c config) originPatterns() []string { return commaList(c.Origins) }

// adminHosts parses --admin-hosts.
func (c config) adminHosts() []string { return commaList(c.AdminHosts) }

// commaList is a comma-separated setting's items, trimmed, empty ones left
// out.
func commaList(s string) []string {
	var out []string
	for item := range strings.SplitSeq(s, ",") {
		if item = strings.TrimSpace(item); item != "" {
			out = append(out, item)
		}
	}
	return out
}
