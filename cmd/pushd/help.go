package main

import (
	"flag"
	"fmt"
	"io"
	"slices"
)

// settingGroup is one concern's settings, in the order -h lists them.
type settingGroup struct {
	name  string
	flags []string
}

// settingGroups hold every setting of the node, each in one group (a test
// holds them to the flag set); -h all and docs/CONFIG.md list them so.
var settingGroups = []settingGroup{
	{"Listeners", []string{"listen", "admin-listen", "admin-hosts", "allowed-origins", "trusted-proxies",
		"request-timeout", "max-header-bytes", "max-url-bytes", "drain-timeout", "demo"}},
	{"Redis", []string{"redis-url", "redis-cache-url", "redis-control-url", "redis-realtime-url", "redis-cluster",
		"key-prefix", "streams", "stream-maxlen", "stream-cluster-reads", "announce-reconcile-interval"}},
	{"PostgreSQL", []string{"database-url", "read-changes", "repair-interval"}},
	{"Tokens and sessions", []string{"jwt-secret", "jwt-secret-file", "jwt-public-key", "jwt-algorithm",
		"jwt-audience", "jwt-issuer", "jwt-max-ttl", "api-key", "api-key-file",
		"session-check-interval", "session-negative-entries", "session-negative-ttl", "session-db-queries", "session-db-wait"}},
	{"Connections", []string{"heartbeat", "write-timeout", "writers", "socket-send-buffer", "sse-retry",
		"reconnect-after", "first-request-timeout", "subscribe-timeout", "max-subscriptions", "max-ids",
		"subscribe-reads", "subscribe-read-burst", "hot-task-watchers", "poll-interval",
		"ws-compression", "ws-control-frames", "ws-max-bad-messages", "ws-max-message-bytes", "ws-request-burst", "ws-request-rate"}},
	{"Limits", []string{"max-conns", "max-conns-per-ip", "max-conns-per-tenant", "max-conns-per-user",
		"connect-ip-burst", "connect-ip-rate", "connect-user-burst", "connect-user-rate",
		"auth-failure-addresses", "auth-failure-burst", "auth-failure-rate",
		"api-window", "api-limit-free", "api-limit-pro", "api-limit-enterprise", "default-plan", "plan-cache-ttl",
		"poll-user-burst", "poll-user-rate", "admission-timeout", "admission-retry"}},
	{"Fleet", []string{"node-name", "expected-nodes", "lease-ttl", "lease-renew-interval", "lease-reconcile-interval"}},
	{"Logs, config and debugging", []string{"config", "log-level", "log-format", "debug-listen"}},
}

// firstDeployment are the settings pushd -h shows: what a node beside
// Redis and PostgreSQL, behind a balancer, is first deployed with.
var firstDeployment = []string{
	"listen", "admin-listen", "allowed-origins", "trusted-proxies",
	"redis-url", "database-url",
	"jwt-secret", "jwt-public-key", "api-key",
	"node-name",
	"config", "log-format",
}

const usageHead = `Usage: pushd [flags]
       pushd version
       pushd token [flags]         mint a token (pushd token -h)
       pushd token verify [TOKEN]  check a token as this node would
       pushd migrate [flags]       create the database if missing and apply db/migrations (development)

Every flag can also be set by its environment variable, or as
"name = value" in the --config file. A flag wins over the environment,
which wins over the file.
`

// printUsage writes the node's usage: the first deployment's settings by
// group, or with all every setting.
func printUsage(w io.Writer, fs *flag.FlagSet, all bool) {
	fmt.Fprint(w, usageHead)
	if !all {
		fmt.Fprint(w, "\nThe settings a first deployment sets:\n")
	}
	total := 0
	for _, g := range settingGroups {
		total += len(g.flags)
		var shown []string
		for _, name := range g.flags {
			if all || slices.Contains(firstDeployment, name) {
				shown = append(shown, name)
			}
		}
		if len(shown) == 0 {
			continue
		}
		fmt.Fprintf(w, "\n%s:\n", g.name)
		for _, name := range shown {
			printFlag(w, fs.Lookup(name), envName(name))
		}
	}
	if !all {
		fmt.Fprintf(w, "\npushd -h all lists all %d settings in these groups; docs/CONFIG.md has them too.\n", total)
	}
}

// helpAll reports whether a command line that asked for help asked for
// all of it: -h all, --help all.
func helpAll(args []string) bool {
	i := slices.IndexFunc(args, func(a string) bool {
		return a == "-h" || a == "--h" || a == "-help" || a == "--help"
	})
	return i >= 0 && i+1 < len(args) && args[i+1] == "all"
}
