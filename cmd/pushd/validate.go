package main

import (
	"errors"
	"log/slog"
	"math"
	"net"
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
	for name, u := range map[string]string{
		"redis-url": c.RedisURL, "redis-cache-url": c.RedisCacheURL,
		"redis-control-url": c.RedisControlURL, "redis-realtime-url": c.RedisRealtimeURL,
	} {
		if u == "" {
			continue
		}
		check := checkRedisURL
		if name == "redis-url" && c.RedisCluster {
			check = checkClusterURL
		}
		if err := check(u); err != nil {
			bad(name, "%v", err)
		}
	}
	if c.DatabaseURL != "" {
		if err := checkDatabaseURL(c.DatabaseURL); err != nil {
			bad("database-url", "%v", err)
		}
	}
	if _, err := c.trustedProxies(); err != nil {
		bad("trusted-proxies", "%v", err)
	}

	if c.JWTSecret != "" && c.JWTPublicKey != "" {
		bad("jwt-public-key", "set --jwt-secret (from %s) or --jwt-public-key, not both", from.of("jwt-secret"))
	}
	switch c.JWTAlgorithm {
	case "", auth.AlgHS256, auth.AlgRS256, auth.AlgES256, auth.AlgEdDSA:
	default:
		bad("jwt-algorithm", "%q: want HS256, RS256, ES256 or EdDSA", c.JWTAlgorithm)
	}
	if c.JWTMaxTTL <= 0 {
		bad("jwt-max-ttl", "%v: must be positive (every token's lifetime is bounded; set a longer bound, 720h say, for longer tokens)", c.JWTMaxTTL)
	}
	if c.NodeName == "" {
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
	c.Admission.validate(bad)
	// Which settings go together is the node's to say, for every front end.
	for _, p := range c.nodeConfig("", nil).Problems() {
		bad(p.Setting, "%s", p.Problem)
	}
	return errors.Join(errs...)
}

// validateRanges checks the numeric settings: the durations, sizes, counts
// and rates the node would read a zero or a negative of as a default.
func (c config) validateRanges(bad func(name, format string, args ...any)) {
	for name, d := range map[string]time.Duration{
		"heartbeat": c.Heartbeat, "poll-interval": c.PollInterval, "write-timeout": c.WriteTimeout,
		"sse-retry": c.Retry, "drain-timeout": c.DrainTimeout, "reconnect-after": c.ReconnectAfter,
		"request-timeout": c.RequestTimeout, "announce-reconcile-interval": c.AnnounceRepair,
		"repair-interval":   c.RepairInterval,
		"subscribe-timeout": c.Conn.SubscribeTimeout, "first-request-timeout": c.Conn.FirstRequestTimeout,
		"session-negative-ttl": c.Sessions.NegativeTTL, "session-db-wait": c.Sessions.DBWait,
	} {
		if d <= 0 {
			bad(name, "%v: must be positive", d)
		}
	}
	if c.StreamMaxLen <= 0 {
		bad("stream-maxlen", "%d: must be positive", c.StreamMaxLen)
	}
	if c.StreamReads <= 0 {
		bad("stream-cluster-reads", "%d: must be positive", c.StreamReads)
	}
	for name, n := range map[string]int{"max-conns": c.MaxConns, "max-conns-per-ip": c.MaxConnsPerIP, "auth-failure-burst": c.AuthFailureBurst,
		"socket-send-buffer": c.Conn.SendBuffer} {
		if n < 0 {
			bad(name, "%d: must not be negative", n)
		}
	}
	for name, n := range map[string]int{"max-header-bytes": c.MaxHeaderBytes, "max-url-bytes": c.MaxURLBytes,
		"writers": c.Conn.Writers, "max-subscriptions": c.Conn.MaxSubscriptions, "max-ids": c.Conn.MaxIDs,
		"subscribe-read-burst": c.Conn.SubscribeReadBurst, "ws-request-burst": c.Conn.WSRequestBurst, "hot-task-watchers": c.Conn.HotTaskWatchers,
		"ws-max-bad-messages": c.Conn.WSMaxBadMessages, "ws-max-message-bytes": int(min(c.Conn.WSMaxMessageBytes, 1<<30))} {
		if n <= 0 {
			bad(name, "%d: must be positive", n)
		}
	}
	if c.MaxURLBytes > c.MaxHeaderBytes && c.MaxHeaderBytes > 0 {
		bad("max-url-bytes", "%d: must not exceed --max-header-bytes (%d), which counts the URL too", c.MaxURLBytes, c.MaxHeaderBytes)
	}
	if r := c.AuthFailureRate; math.IsNaN(r) || math.IsInf(r, 0) || r < 0 {
		bad("auth-failure-rate", "%v: must be a number, not negative", r)
	}
	for name, r := range map[string]float64{"subscribe-reads": c.Conn.SubscribeReads, "ws-request-rate": c.Conn.WSRequestRate, "ws-control-frames": c.Conn.WSControlFrames} {
		if math.IsNaN(r) || math.IsInf(r, 0) || r <= 0 {
			bad(name, "%v: must be a positive number", r)
		}
	}
	for name, n := range map[string]int{"auth-failure-addresses": c.AuthFailureAddresses,
		"session-negative-entries": c.Sessions.NegativeEntries, "session-db-queries": c.Sessions.DBQueries} {
		if n < 1 {
			bad(name, "%d: must be at least 1", n)
		}
	}
}

func (a admissionFlags) validate(bad func(name, format string, args ...any)) {
	for name, v := range map[string]float64{
		"connect-user-burst": float64(a.UserBurst), "connect-user-rate": a.UserRate,
		"connect-ip-burst": float64(a.IPBurst), "connect-ip-rate": a.IPRate,
		"max-conns-per-user": float64(a.MaxPerUser), "max-conns-per-tenant": float64(a.MaxPerTenant),
		"api-limit-free": float64(a.Free), "api-limit-pro": float64(a.Pro), "api-limit-enterprise": float64(a.Enterprise),
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
		"lease-renew-interval": a.Renew, "lease-reconcile-interval": a.Reconcile,
		"admission-timeout": a.Timeout, "admission-retry": a.Retry, "session-check-interval": a.SessionCheck,
	} {
		if d <= 0 {
			bad(name, "%v: must be positive", d)
		}
	}
	if a.Renew > 0 && a.Renew >= a.LeaseTTL {
		bad("lease-renew-interval", "%v: must be shorter than --lease-ttl (%v)", a.Renew, a.LeaseTTL)
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
