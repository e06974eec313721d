package main

import (
	"io"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// The token and authentication flags join flagCases, so the -h and env
// twin tests cover them too.
func init() {
	for name, fc := range map[string]flagCase{
		"jwt-audience":             {"env-aud", "flag-aud", func(c config) string { return c.JWTAudience }},
		"jwt-issuer":               {"https://env.example", "https://flag.example", func(c config) string { return c.Node.JWTIssuer }},
		"jwt-max-ttl":              {"1h0m0s", "2h0m0s", func(c config) string { return dur(c.Node.JWTMaxTTL) }},
		"auth-failure-burst":       {"5", "6", func(c config) string { return strconv.Itoa(c.Node.API.AuthFailureBurst) }},
		"auth-failure-rate":        {"0.5", "2", func(c config) string { return strconv.FormatFloat(c.Node.API.AuthFailureRate, 'g', -1, 64) }},
		"auth-failure-addresses":   {"100", "200", func(c config) string { return strconv.Itoa(c.Node.API.AuthFailureAddresses) }},
		"session-negative-ttl":     {"5s", "20s", func(c config) string { return dur(c.Node.Sessions.NegativeTTL) }},
		"session-negative-entries": {"10", "20", func(c config) string { return strconv.Itoa(c.Node.Sessions.NegativeEntries) }},
		"session-db-queries":       {"2", "3", func(c config) string { return strconv.Itoa(c.Node.Sessions.MaxDBQueries) }},
		"session-db-wait":          {"100ms", "200ms", func(c config) string { return dur(c.Node.Sessions.DBQueueWait) }},
		"jwt-secret-file":          {"testdata/env-secret", "testdata/flag-secret", func(c config) string { return c.JWTSecretFile }},
		"api-key-file":             {"testdata/env-secret", "testdata/flag-secret", func(c config) string { return c.APIKeyFile }},
	} {
		flagCases[name] = fc
	}
	for _, name := range []string{"jwt-audience", "jwt-issuer"} {
		needs[name] = []string{"--jwt-secret", "s"}
	}
}

func TestJWTClaimFlags(t *testing.T) {
	c, err := parseConfig([]string{"--jwt-secret", "s", "--jwt-audience", " pushd, ,pushd-staging ", "--jwt-issuer", "https://login.example"}, env(), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if got := c.jwtAudience(); !slices.Equal(got, []string{"pushd", "pushd-staging"}) {
		t.Errorf("audiences %q", got)
	}
	if c, _ := parseConfig(nil, env(), io.Discard); c.jwtAudience() != nil || c.Node.JWTIssuer != "" || c.Node.JWTMaxTTL != 24*time.Hour {
		t.Errorf("defaults check claims: audience %q, issuer %q, max ttl %v", c.jwtAudience(), c.Node.JWTIssuer, c.Node.JWTMaxTTL)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--jwt-max-ttl", "-1h"}, "--jwt-max-ttl (from the command line): -1h0m0s: must be positive"},
		{[]string{"--jwt-max-ttl", "0"}, "--jwt-max-ttl (from the command line): 0s: must be positive"},
		{[]string{"--jwt-audience", "pushd"}, "--jwt-audience (from the command line): needs --jwt-secret or --jwt-public-key"},
		{[]string{"--jwt-issuer", "https://login.example"}, "--jwt-issuer (from the command line): needs --jwt-secret or --jwt-public-key"},
	} {
		_, err := parseConfig(tc.args, env(), io.Discard)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: error %v, want one containing %q", tc.args, err, tc.want)
		}
	}
}

func TestAuthFailureFlags(t *testing.T) {
	c, err := parseConfig(nil, env(), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if c.Node.API.AuthFailureBurst != 20 || c.Node.API.AuthFailureRate != 1 || c.Node.API.AuthFailureAddresses != 65536 {
		t.Errorf("defaults: burst %d, rate %v, addresses %d", c.Node.API.AuthFailureBurst, c.Node.API.AuthFailureRate, c.Node.API.AuthFailureAddresses)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--auth-failure-burst", "-1"}, "--auth-failure-burst (from the command line): -1: must not be negative"},
		{[]string{"--auth-failure-rate", "NaN"}, "--auth-failure-rate (from the command line): NaN: must be a number"},
		{[]string{"--auth-failure-rate", "-1"}, "--auth-failure-rate (from the command line): -1: must be a number, not negative"},
		{[]string{"--auth-failure-addresses", "0"}, "--auth-failure-addresses (from the command line): 0: must be at least 1"},
	} {
		_, err := parseConfig(tc.args, env(), io.Discard)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: error %v, want one containing %q", tc.args, err, tc.want)
		}
	}
}

func TestSessionLookupFlags(t *testing.T) {
	c, err := parseConfig(nil, env(), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if s := c.Node.Sessions; s.NegativeTTL != 10*time.Second || s.NegativeEntries != 65536 || s.MaxDBQueries != 4 || s.DBQueueWait != 500*time.Millisecond {
		t.Errorf("defaults %+v", s)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--session-negative-ttl", "0s"}, "--session-negative-ttl (from the command line): 0s: must be positive"},
		{[]string{"--session-db-wait", "0s"}, "--session-db-wait (from the command line): 0s: must be positive"},
		{[]string{"--session-db-queries", "0"}, "--session-db-queries (from the command line): 0: must be at least 1"},
		{[]string{"--session-negative-entries", "0"}, "--session-negative-entries (from the command line): 0: must be at least 1"},
	} {
		_, err := parseConfig(tc.args, env(), io.Discard)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: error %v, want one containing %q", tc.args, err, tc.want)
		}
	}
}
