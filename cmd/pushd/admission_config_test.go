package main

import (
	"io"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/pushd/pushd/admission"
)

// The admission and Redis role flags join flagCases, so the -h and env twin
// tests cover them too.
func init() {
	itoa := strconv.Itoa
	ftoa := func(f float64) string { return strconv.FormatFloat(f, 'g', -1, 64) }
	for name, fc := range map[string]flagCase{
		"redis-cache-url":          {"redis://env-c:6379/0", "redis://flag-c:6379/0", func(c config) string { return c.Node.RedisCacheURL }},
		"redis-control-url":        {"redis://env-k:6379/0", "redis://flag-k:6379/0", func(c config) string { return c.Node.RedisControlURL }},
		"redis-realtime-url":       {"redis://env-r:6379/0", "redis://flag-r:6379/0", func(c config) string { return c.Node.RedisRealtimeURL }},
		"connect-user-burst":       {"5", "6", func(c config) string { return itoa(c.Node.Admission.ConnectUserBurst) }},
		"connect-user-rate":        {"0.5", "2", func(c config) string { return ftoa(c.Node.Admission.ConnectUserRate) }},
		"connect-ip-burst":         {"50", "60", func(c config) string { return itoa(c.Node.Admission.ConnectIPBurst) }},
		"connect-ip-rate":          {"5", "6", func(c config) string { return ftoa(c.Node.Admission.ConnectIPRate) }},
		"max-conns-per-user":       {"7", "8", func(c config) string { return itoa(c.Node.Admission.MaxConnsPerUser) }},
		"max-conns-per-tenant":     {"70", "80", func(c config) string { return itoa(c.Node.Admission.MaxConnsPerTenant) }},
		"poll-user-burst":          {"3", "4", func(c config) string { return itoa(c.Node.Admission.PollUserBurst) }},
		"poll-user-rate":           {"0.5", "2", func(c config) string { return ftoa(c.Node.Admission.PollUserRate) }},
		"api-limit-free":           {"10", "11", func(c config) string { return itoa(c.Node.Admission.Plans[admission.PlanFree]) }},
		"api-limit-pro":            {"100", "110", func(c config) string { return itoa(c.Node.Admission.Plans[admission.PlanPro]) }},
		"api-limit-enterprise":     {"1000", "1100", func(c config) string { return itoa(c.Node.Admission.Plans[admission.PlanEnterprise]) }},
		"default-plan":             {"pro", "enterprise", func(c config) string { return c.Node.Admission.DefaultPlan }},
		"api-window":               {"30s", "2m0s", func(c config) string { return dur(c.Node.Admission.APIWindow) }},
		"plan-cache-ttl":           {"10s", "20s", func(c config) string { return dur(c.Node.Admission.PlanCacheTTL) }},
		"lease-ttl":                {"40s", "50s", func(c config) string { return dur(c.Node.Admission.LeaseTTL) }},
		"lease-renew-interval":     {"5s", "6s", func(c config) string { return dur(c.Node.Admission.RenewInterval) }},
		"lease-reconcile-interval": {"2m0s", "3m0s", func(c config) string { return dur(c.Node.Admission.ReconcileInterval) }},
		"expected-nodes":           {"3", "4", func(c config) string { return itoa(c.Node.Admission.ExpectedNodes) }},
		"admission-timeout":        {"50ms", "75ms", func(c config) string { return dur(c.Node.Admission.Timeout) }},
		"admission-retry":          {"2s", "3s", func(c config) string { return dur(c.Node.Admission.RetryAfterFailure) }},
		"session-check-interval":   {"5s", "15s", func(c config) string { return dur(c.Node.Admission.SessionCheckInterval) }},
	} {
		flagCases[name] = fc
	}
	for _, role := range []string{"redis-cache-url", "redis-control-url", "redis-realtime-url"} {
		needs[role] = []string{"--redis-url", "redis://other:6379/0", "--jwt-secret", "s"}
	}
}

func TestAdmissionDefaultsAreProduction(t *testing.T) {
	c, err := parseConfig(nil, env(), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	a := c.Node.Admission
	if a.ConnectUserBurst != 20 || a.ConnectUserRate != 1 || a.ConnectIPBurst != 200 || a.ConnectIPRate != 20 ||
		a.MaxConnsPerUser != 50 || a.MaxConnsPerTenant != 10000 || a.LeaseTTL != 30*time.Second ||
		a.RenewInterval != 10*time.Second || a.Timeout != 100*time.Millisecond || a.ExpectedNodes != 1 {
		t.Fatalf("admission defaults %+v", a)
	}
	for plan, want := range admission.DefaultPlans() {
		if a.Plans[plan] != want {
			t.Errorf("plan %s: %d requests, want %d", plan, a.Plans[plan], want)
		}
	}
}

func TestAdmissionConfigErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--redis-control-url", "redis://c:6379/0"}, "--redis-control-url (from the command line): needs --redis-url"},
		{[]string{"--max-conns-per-user", "-1"}, "--max-conns-per-user (from the command line): -1: must not be negative"},
		{[]string{"--connect-ip-rate", "-2"}, "--connect-ip-rate (from the command line): -2: must not be negative"},
		{[]string{"--lease-ttl", "5s", "--lease-renew-interval", "5s"}, "shorter than --lease-ttl"},
		{[]string{"--admission-timeout", "0s"}, "--admission-timeout (from the command line): 0s: must be positive"},
		{[]string{"--expected-nodes", "0"}, "at least 1"},
		{[]string{"--default-plan", "gold"}, "--default-plan"},
	} {
		_, err := parseConfig(tc.args, env(), io.Discard)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: error %v, want one containing %q", tc.args, err, tc.want)
		}
	}
}
