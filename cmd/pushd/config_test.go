package main

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// env is an environment of name, value pairs.
func env(kv ...string) []string {
	var out []string
	for i := 0; i+1 < len(kv); i += 2 {
		out = append(out, kv[i]+"="+kv[i+1])
	}
	return out
}

// flagCase says how to set a flag and where its value lands.
type flagCase struct {
	env, flag string // two distinct valid values
	get       func(config) string
}

func dur(d time.Duration) string { return d.String() }

// flagCases is every flag of parseConfig. TestEveryFlagHasEnvTwin checks
// it against the -h listing, so a new flag cannot go untested.
var flagCases = map[string]flagCase{
	"listen":                      {"127.0.0.1:9001", "127.0.0.1:9002", func(c config) string { return c.Listen }},
	"redis-url":                   {"redis://env:6379/0", "redis://flag:6379/1", func(c config) string { return c.Node.RedisURL }},
	"key-prefix":                  {"env:", "flag:", func(c config) string { return c.Node.KeyPrefix }},
	"database-url":                {"postgres://env/db", "postgres://flag/db", func(c config) string { return c.Node.DatabaseURL }},
	"jwt-secret":                  {"env-secret", "flag-secret", func(c config) string { return c.JWTSecret }},
	"jwt-public-key":              {"testdata/env-key.pem", "testdata/flag-key.pem", func(c config) string { return c.JWTPublicKey }},
	"jwt-algorithm":               {"RS256", "ES256", func(c config) string { return c.Node.JWTAlgorithm }},
	"api-key":                     {"env-key", "flag-key", func(c config) string { return c.Node.APIKey }},
	"max-conns":                   {"100", "200", func(c config) string { return strconv.Itoa(c.Node.MaxConns) }},
	"max-conns-per-ip":            {"10", "20", func(c config) string { return strconv.Itoa(c.Node.API.MaxConnsPerIP) }},
	"request-timeout":             {"3s", "4s", func(c config) string { return dur(c.Node.RequestTimeout) }},
	"max-header-bytes":            {"32768", "16384", func(c config) string { return strconv.Itoa(c.Node.MaxHeaderBytes) }},
	"max-url-bytes":               {"4096", "2048", func(c config) string { return strconv.Itoa(c.Node.API.MaxURLBytes) }},
	"node-name":                   {"env-node", "flag-node", func(c config) string { return c.Node.NodeName }},
	"allowed-origins":             {"env.example", "flag.example", func(c config) string { return c.Origins }},
	"trusted-proxies":             {"10.0.0.1", "10.0.0.0/8", func(c config) string { return c.TrustedProxies }},
	"heartbeat":                   {"7s", "8s", func(c config) string { return dur(c.Node.Hub.HeartbeatInterval) }},
	"poll-interval":               {"3s", "4s", func(c config) string { return dur(c.Node.Hub.PollInterval) }},
	"write-timeout":               {"3s", "4s", func(c config) string { return dur(c.Node.Hub.WriteTimeout) }},
	"sse-retry":                   {"1.5s", "2.5s", func(c config) string { return dur(c.Node.SSE.Retry) }},
	"drain-timeout":               {"1m0s", "2m0s", func(c config) string { return dur(c.DrainTimeout) }},
	"reconnect-after":             {"9s", "11s", func(c config) string { return dur(c.Node.ReconnectAfter) }},
	"debug-listen":                {"127.0.0.1:1", "127.0.0.1:2", func(c config) string { return c.DebugListen }},
	"admin-listen":                {"127.0.0.1:3", "127.0.0.1:4", func(c config) string { return c.AdminListen }},
	"admin-hosts":                 {"env.svc", "flag.svc", func(c config) string { return c.AdminHosts }},
	"demo":                        {"true", "false", func(c config) string { return strconv.FormatBool(c.Node.Demo) }},
	"streams":                     {"true", "false", func(c config) string { return strconv.FormatBool(c.Node.Streams) }},
	"read-changes":                {"true", "false", func(c config) string { return strconv.FormatBool(c.Node.ReadChanges) }},
	"redis-cluster":               {"true", "false", func(c config) string { return strconv.FormatBool(c.Node.RedisCluster) }},
	"stream-maxlen":               {"500", "600", func(c config) string { return strconv.FormatInt(c.Node.StreamMaxLen, 10) }},
	"stream-cluster-reads":        {"32", "64", func(c config) string { return strconv.Itoa(c.Node.Stream.ClusterReads) }},
	"announce-reconcile-interval": {"3s", "7s", func(c config) string { return dur(c.Node.Reconcile.Interval) }},
	"repair-interval":             {"4s", "6s", func(c config) string { return dur(c.Node.Hub.RepairInterval) }},
	"log-level":                   {"debug", "warn", func(c config) string { return c.LogLevel }},
	"log-format":                  {"json", "text", func(c config) string { return c.LogFormat }},
}

// needs is what a flag needs beside it to pass validation: a node with
// Redis needs a key for its tokens.
var needs = map[string][]string{
	"redis-url":     {"--jwt-secret", "s"},
	"database-url":  {"--redis-url", "redis://other:6379/0", "--jwt-secret", "s"},
	"streams":       {"--redis-url", "redis://other:6379/0", "--jwt-secret", "s"},
	"read-changes":  {"--redis-url", "redis://other:6379/0", "--database-url", "postgres://db/pushd", "--jwt-secret", "s"},
	"redis-cluster": {"--redis-url", "redis://other:6379/0", "--jwt-secret", "s"},
}

// usage returns parseConfig's -h output.
func usage(t *testing.T, args ...string) string {
	t.Helper()
	var out bytes.Buffer
	if _, err := parseConfig(append([]string{"-h"}, args...), env(), &out); !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("-h: %v, want flag.ErrHelp", err)
	}
	return out.String()
}

var usageFlagRE = regexp.MustCompile(`(?m)^  --([a-z-]+) \((PUSHD_[A-Z_]+)\)$`)

// -h all lists every flag with its environment twin, group by group in
// settingGroups' order; -h lists the first deployment's alone, in the
// same order.
func TestHelpListsEveryFlagWithItsEnvName(t *testing.T) {
	out := usage(t, "all")
	var listed []string
	for _, m := range usageFlagRE.FindAllStringSubmatch(out, -1) {
		name, envVar := m[1], m[2]
		listed = append(listed, name)
		if want := "PUSHD_" + strings.ToUpper(strings.ReplaceAll(name, "-", "_")); envVar != want {
			t.Errorf("--%s listed with %s, want %s", name, envVar, want)
		}
	}
	var grouped []string
	for _, g := range settingGroups {
		grouped = append(grouped, g.flags...)
		if !strings.Contains(out, "\n"+g.name+":\n") {
			t.Errorf("-h all lacks the group %q", g.name)
		}
	}
	if !slices.Equal(listed, grouped) {
		t.Errorf("-h all lists %v, want the groups' %v", listed, grouped)
	}
	want := []string{"config"} // config_file_test.go tests it: its values must be files
	for name := range flagCases {
		want = append(want, name)
	}
	slices.Sort(listed)
	slices.Sort(want)
	if !slices.Equal(listed, want) {
		t.Errorf("-h all lists flags %v, want %v:\n%s", listed, want, out)
	}
	for _, s := range []string{"Usage: pushd", "environment variable", `(default ":8080")`, `(default "25s")`} {
		if !strings.Contains(out, s) {
			t.Errorf("-h all output lacks %q:\n%s", s, out)
		}
	}

	short := usage(t)
	var first []string
	for _, m := range usageFlagRE.FindAllStringSubmatch(short, -1) {
		first = append(first, m[1])
	}
	var wantFirst []string
	for _, name := range grouped {
		if slices.Contains(firstDeployment, name) {
			wantFirst = append(wantFirst, name)
		}
	}
	if !slices.Equal(first, wantFirst) || len(first) != len(firstDeployment) {
		t.Errorf("-h lists %v, want the first deployment's %v in the groups' order", first, wantFirst)
	}
	if !strings.Contains(short, fmt.Sprintf("pushd -h all lists all %d settings", len(want))) {
		t.Errorf("-h does not point to -h all for the %d settings:\n%s", len(want), short)
	}
}

// Every setting is in exactly one group, and every name a group lists is
// a setting.
func TestSettingGroupsHoldEveryFlagOnce(t *testing.T) {
	seen := map[string]string{}
	for _, g := range settingGroups {
		for _, name := range g.flags {
			if other, ok := seen[name]; ok {
				t.Errorf("--%s is in %q and %q", name, other, g.name)
			}
			seen[name] = g.name
		}
	}
	newFlagSet(&config{}).VisitAll(func(f *flag.Flag) {
		if _, ok := seen[f.Name]; !ok {
			t.Errorf("--%s is in no group of settingGroups", f.Name)
		}
		delete(seen, f.Name)
	})
	for name := range seen {
		t.Errorf("settingGroups lists --%s, which is no setting", name)
	}
}

func TestEveryFlagHasEnvTwin(t *testing.T) {
	for name, fc := range flagCases {
		t.Run(name, func(t *testing.T) {
			getenv := env(envName(name), fc.env)
			c, err := parseConfig(needs[name], getenv, io.Discard)
			if err != nil {
				t.Fatalf("%s=%s: %v", envName(name), fc.env, err)
			}
			if got := fc.get(c); got != fc.env {
				t.Errorf("%s=%s set %q", envName(name), fc.env, got)
			}

			args := append([]string{"--" + name + "=" + fc.flag}, needs[name]...) // = form: bool flags take no separate value
			c, err = parseConfig(args, getenv, io.Discard)
			if err != nil {
				t.Fatalf("%v with %s=%s: %v", args, envName(name), fc.env, err)
			}
			if got := fc.get(c); got != fc.flag {
				t.Errorf("--%s %s with %s=%s set %q, want the flag to win", name, fc.flag, envName(name), fc.env, got)
			}
		})
	}
}

func TestRedisURLFromEnv(t *testing.T) {
	c, err := parseConfig(nil, env("PUSHD_REDIS_URL", "redis://r:6379/2", "PUSHD_JWT_SECRET", "s"), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if c.Node.RedisURL != "redis://r:6379/2" || c.Embedded() {
		t.Fatalf("RedisURL %q embedded %v, want the env value and not embedded", c.Node.RedisURL, c.Embedded())
	}
	c, err = parseConfig([]string{"--redis-url", "redis://flag:6379/0"}, env("PUSHD_REDIS_URL", "redis://r:6379/2", "PUSHD_JWT_SECRET", "s"), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if c.Node.RedisURL != "redis://flag:6379/0" {
		t.Fatalf("RedisURL %q, want the flag's", c.Node.RedisURL)
	}
}

func TestDefaultsAreEmbedded(t *testing.T) {
	c, err := parseConfig(nil, env(), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if !c.Embedded() || c.Listen != ":8080" || c.LogFormat != "text" || c.LogLevel != "info" || c.DrainTimeout != 10*time.Second {
		t.Fatalf("defaults %+v", c)
	}
	if got := c.originPatterns(); got != nil {
		t.Errorf("origin patterns %q, want none", got)
	}
	c.Origins = " a.example, ,*.b.example ,"
	if got := c.originPatterns(); !slices.Equal(got, []string{"a.example", "*.b.example"}) {
		t.Errorf("origin patterns %q", got)
	}
}

func TestParseConfigErrors(t *testing.T) {
	for _, tc := range []struct {
		name   string
		args   []string
		getenv []string
		want   string // in the error
	}{
		{"bad duration in env", nil, env("PUSHD_HEARTBEAT", "soon"), `--heartbeat (from PUSHD_HEARTBEAT): invalid value "soon"`},
		{"bad drain timeout in env", nil, env("PUSHD_DRAIN_TIMEOUT", "30"), "--drain-timeout (from PUSHD_DRAIN_TIMEOUT)"},
		{"bad duration flag", []string{"--write-timeout", "later"}, env(), "write-timeout"},
		{"database without redis", []string{"--database-url", "postgres://h/db"}, env(), "--database-url (from the command line): needs --redis-url"},
		{"database without redis from env", nil, env("PUSHD_DATABASE_URL", "postgres://h/db"), "--database-url (from PUSHD_DATABASE_URL): needs --redis-url"},
		{"secret and public key", []string{"--jwt-secret", "s", "--jwt-public-key", "k.pem"}, env(), "not both"},
		{"secret in env and public key flag", []string{"--jwt-public-key", "k.pem"}, env("PUSHD_JWT_SECRET", "s"), "not both"},
		{"positional argument", []string{"serve"}, env(), `unexpected argument "serve"`},
		{"positional argument after flags", []string{"--listen", ":1", "extra"}, env(), `unexpected argument "extra"`},
		{"unknown flag", []string{"--redis"}, env(), "redis"},
		// A setting that kept its default came from nowhere: the message
		// says what to set, and how to make a secret.
		{"no secret beside redis", []string{"--redis-url", "redis://h:6379/0"}, env(), "--jwt-secret: set --jwt-secret (make one: openssl rand -base64 32) or --jwt-public-key"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := parseConfig(tc.args, tc.getenv, io.Discard)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want one containing %q", err, tc.want)
			}
		})
	}
}

func TestRunRefusesBadSettingsBeforeServing(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--log-format", "xml"}, `--log-format (from the command line): "xml": want text or json`},
		{[]string{"--log-level", "loud"}, `--log-level (from the command line): "loud"`},
		{[]string{"--jwt-public-key", "/nonexistent/pushd-test-key.pem"}, "--jwt-public-key (from the command line): stat /nonexistent/pushd-test-key.pem"},
		{[]string{"--listen", "127.0.0.1:-1"}, "--listen (from the command line)"},
	} {
		t.Run(fmt.Sprint(tc.args), func(t *testing.T) {
			var out bytes.Buffer
			err := run(tc.args, env(), &out, &out)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("run %v: %v, want an error containing %q\n%s", tc.args, err, tc.want, &out)
			}
		})
	}
}

// A second node on one host that was given its own --listen but not its
// own --admin-listen fails to start, saying which port is taken, before it
// says it serves.
func TestRunFailsOnAPortInUseBeforeServing(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	for _, flag := range []string{"--admin-listen", "--debug-listen"} {
		t.Run(flag, func(t *testing.T) {
			var out bytes.Buffer
			err := run([]string{"--listen", "127.0.0.1:0", flag, taken.Addr().String()}, env(), &out, &out)
			if want := flag + " " + taken.Addr().String() + ": "; err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "address already in use") {
				t.Fatalf("run: %v, want an error starting %q that says the address is in use", err, want)
			}
			if strings.Contains(out.String(), "serving") {
				t.Fatalf("the node said it serves before failing:\n%s", &out)
			}
		})
	}
}

func TestRunHelp(t *testing.T) {
	var out bytes.Buffer
	if err := run([]string{"-h"}, env(), &out, io.Discard); !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("run -h: %v, want flag.ErrHelp (main exits 0)", err)
	}
	if !strings.Contains(out.String(), "PUSHD_REDIS_URL") {
		t.Fatalf("run -h wrote:\n%s", &out)
	}
}
