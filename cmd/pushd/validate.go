package main

import (
	"errors"
	"log/slog"
	"math"
	"net"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/pushd/pushd/admission"
	"github.com/pushd/pushd/auth"
)

// validate checks every setting at start, so that a bad value stops the
// node with its name and origin instead of failing later, or silently
// meaning a default (the node reads a zero duration as "use the default").
// Each value is checked here, where it is parsed; the combinations of
// settings the node's modes allow are node.Config.Problems'. It reports
// every bad setting at once.
func (c config) validate(from origins) error {
	var errs []error
	bad := func(name, format string, args ...any) {
		errs = append(errs, from.settingError(name, format, args...))
	}

	checkAddr(bad, "listen", c.Listen, false)
	checkAddr(bad, "debug-listen", c.DebugListen, true)
	if c.DebugListen != "" && c.DebugListen == c.Listen {
		bad("debug-listen", "must differ from --listen: profiles are never served on the public address")
	}
	checkAddr(bad, "admin-listen", c.AdminListen, true)
	if c.AdminListen != "" && !strings.HasSuffix(c.AdminListen, ":0") && (c.AdminListen == c.Listen || c.AdminListen == c.DebugListen) {
		bad("admin-listen", "must differ from --listen and --debug-listen: metrics are never served on the public address")
	}
	for _, h := range c.adminHosts() {
		if !hostNameRE.MatchString(h) {
			bad("admin-hosts", "%q: want DNS names without a port (e.g. pushd-admin.monitoring.svc); IP addresses and localhost are always allowed", h)
		}
	}
	for name, u := range map[string]string{
		"redis-url": c.Node.RedisURL, "redis-cache-url": c.Node.RedisCacheURL,
		"redis-control-url": c.Node.RedisControlURL, "redis-realtime-url": c.Node.RedisRealtimeURL,
	} {
		if u == "" {
			continue
		}
		check := checkRedisURL
		if name == "redis-url" && c.Node.RedisCluster {
			check = checkClusterURL
		}
		if err := check(u); err != nil {
			bad(name, "%v", err)
		}
	}
	if c.Node.DatabaseURL != "" {
		if err := checkDatabaseURL(c.Node.DatabaseURL); err != nil {
			bad("database-url", "%v", err)
		}
	}
	if _, err := c.trustedProxies(); err != nil {
		bad("trusted-proxies", "%v", err)
	}

	if c.JWTSecret != "" && c.JWTPublicKey != "" {
		bad("jwt-public-key", "set --jwt-secret (from %s) or --jwt-public-key, not both", from.of("jwt-secret"))
	}
	switch c.Node.JWTAlgorithm {
	case "", auth.AlgHS256, auth.AlgRS256, auth.AlgES256, auth.AlgEdDSA:
	default:
		bad("jwt-algorithm", "%q: want HS256, RS256, ES256 or EdDSA", c.Node.JWTAlgorithm)
	}
	if c.Node.JWTMaxTTL <= 0 {
		bad("jwt-max-ttl", "%v: must be positive (every token's lifetime is bounded; set a longer bound, 720h say, for longer tokens)", c.Node.JWTMaxTTL)
	}
	if c.Node.NodeName == "" {
		bad("node-name", "the host name is unknown: set one")
	}
	c.validateRanges(bad)
	var level slog.Level
	if err := level.UnmarshalText([]byte(c.LogLevel)); err != nil {
		bad("log-level", "%q: want debug, info, warn or error", c.LogLevel)
	}
	if c.LogFormat != "text" && c.LogFormat != "json" {
		bad("log-format", "%q: want text or json", c.LogFormat)
	}
	validateAdmission(c.Node.Admission, bad)
	// Which settings go together is the node's to say, for every front end.
	for _, p := range c.nodeConfig("", nil).Problems() {
		bad(p.Setting, "%s", p.Problem)
	}
	return errors.Join(errs...)
}

// validateRanges checks the numeric settings: the durations, sizes, counts
// and rates the node would read a zero or a negative of as a default.
func (c config) validateRanges(bad func(name, format string, args ...any)) {
	n := c.Node
	for name, d := range map[string]time.Duration{
		"heartbeat": n.Hub.HeartbeatInterval, "poll-interval": n.Hub.PollInterval, "write-timeout": n.Hub.WriteTimeout,
		"sse-retry": n.SSE.Retry, "drain-timeout": c.DrainTimeout, "reconnect-after": n.ReconnectAfter,
		"request-timeout": n.RequestTimeout, "announce-reconcile-interval": n.Reconcile.Interval,
		"repair-interval":   n.Hub.RepairInterval,
		"subscribe-timeout": n.Hub.SubscribeTimeout, "first-request-timeout": n.WS.FirstRequestTimeout,
		"session-negative-ttl": n.Sessions.NegativeTTL, "session-db-wait": n.Sessions.DBQueueWait,
	} {
		if d <= 0 {
			bad(name, "%v: must be positive", d)
		}
	}
	if n.StreamMaxLen <= 0 {
		bad("stream-maxlen", "%d: must be positive", n.StreamMaxLen)
	}
	if n.Stream.ClusterReads <= 0 {
		bad("stream-cluster-reads", "%d: must be positive", n.Stream.ClusterReads)
	}
	for name, v := range map[string]int{"max-conns": n.MaxConns, "max-conns-per-ip": n.API.MaxConnsPerIP, "auth-failure-burst": n.API.AuthFailureBurst,
		"socket-send-buffer": n.Hub.SendBuffer} {
		if v < 0 {
			bad(name, "%d: must not be negative", v)
		}
	}
	for name, v := range map[string]int{"max-header-bytes": n.MaxHeaderBytes, "max-url-bytes": n.API.MaxURLBytes,
		"writers": n.Hub.Writers, "max-subscriptions": n.Hub.MaxSubscriptions, "max-ids": n.Hub.MaxIDs,
		"subscribe-read-burst": n.Hub.SubscribeReadBurst, "ws-request-burst": n.WS.RequestBurst, "hot-task-watchers": n.Hub.HotTaskWatchers,
		"ws-max-bad-messages": n.WS.MaxBadMessages, "ws-max-message-bytes": int(min(n.WS.ReadLimit, 1<<30))} {
		if v <= 0 {
			bad(name, "%d: must be positive", v)
		}
	}
	if n.API.MaxURLBytes > n.MaxHeaderBytes && n.MaxHeaderBytes > 0 {
		bad("max-url-bytes", "%d: must not exceed --max-header-bytes (%d), which counts the URL too", n.API.MaxURLBytes, n.MaxHeaderBytes)
	}
	if r := n.API.AuthFailureRate; math.IsNaN(r) || math.IsInf(r, 0) || r < 0 {
		bad("auth-failure-rate", "%v: must be a number, not negative", r)
	}
	for name, r := range map[string]float64{"subscribe-reads": n.Hub.SubscribeReads, "ws-request-rate": n.WS.RequestRate, "ws-control-frames": n.WS.ControlFrames} {
		if math.IsNaN(r) || math.IsInf(r, 0) || r <= 0 {
			bad(name, "%v: must be a positive number", r)
		}
	}
	for name, v := range map[string]int{"auth-failure-addresses": n.API.AuthFailureAddresses,
		"session-negative-entries": n.Sessions.NegativeEntries, "session-db-queries": n.Sessions.MaxDBQueries} {
		if v < 1 {
			bad(name, "%d: must be at least 1", v)
		}
	}
}

// validateAdmission checks the admission limits; a limit of zero is none.
func validateAdmission(a admission.Config, bad func(name, format string, args ...any)) {
	for name, v := range map[string]float64{
		"connect-user-burst": float64(a.ConnectUserBurst), "connect-user-rate": a.ConnectUserRate,
		"connect-ip-burst": float64(a.ConnectIPBurst), "connect-ip-rate": a.ConnectIPRate,
		"max-conns-per-user": float64(a.MaxConnsPerUser), "max-conns-per-tenant": float64(a.MaxConnsPerTenant),
		"poll-user-burst": float64(a.PollUserBurst), "poll-user-rate": a.PollUserRate,
		"api-limit-free": float64(a.Plans[admission.PlanFree]), "api-limit-pro": float64(a.Plans[admission.PlanPro]),
		"api-limit-enterprise": float64(a.Plans[admission.PlanEnterprise]),
	} {
		switch {
		case math.IsNaN(v) || math.IsInf(v, 0): // ParseFloat accepts both
			bad(name, "%v: must be a number", v)
		case v < 0:
			bad(name, "%v: must not be negative", v)
		}
	}
	for name, d := range map[string]time.Duration{
		"api-window": a.APIWindow, "plan-cache-ttl": a.PlanCacheTTL, "lease-ttl": a.LeaseTTL,
		"lease-renew-interval": a.RenewInterval, "lease-reconcile-interval": a.ReconcileInterval,
		"admission-timeout": a.Timeout, "admission-retry": a.RetryAfterFailure, "session-check-interval": a.SessionCheckInterval,
	} {
		if d <= 0 {
			bad(name, "%v: must be positive", d)
		}
	}
	if a.RenewInterval > 0 && a.RenewInterval >= a.LeaseTTL {
		bad("lease-renew-interval", "%v: must be shorter than --lease-ttl (%v)", a.RenewInterval, a.LeaseTTL)
	}
	if a.ExpectedNodes < 1 {
		bad("expected-nodes", "%d: must be at least 1", a.ExpectedNodes)
	}
	switch a.DefaultPlan {
	case admission.PlanFree, admission.PlanPro, admission.PlanEnterprise:
	default:
		bad("default-plan", "%q: want free, pro or enterprise", a.DefaultPlan)
	}
}

// checkAddr checks a host:port to listen on; the port is a number from 0
// (any free port) to 65535.
// hostNameRE is a DNS name --admin-hosts takes: labels of letters, digits
// and hyphens, a trailing dot allowed, no port, no wildcard.
var hostNameRE = regexp.MustCompile(`^(?i:[a-z0-9]([a-z0-9-]*[a-z0-9])?)(\.(?i:[a-z0-9]([a-z0-9-]*[a-z0-9])?))*\.?$`)

func checkAddr(bad func(name, format string, args ...any), name, addr string, optional bool) {
	if addr == "" {
		if !optional {
			bad(name, "must not be empty")
		}
		return
	}
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		bad(name, "%q: want host:port or :port: %v", addr, err)
		return
	}
	if p, err := strconv.ParseUint(port, 10, 16); err != nil || p > math.MaxUint16 {
		bad(name, "%q: the port must be a number from 0 to 65535", addr)
	}
}
