package main

import (
	"io"
	"slices"
	"strings"
	"testing"
)

// The token and authentication flags join flagCases, so the -h and env
// twin tests cover them too.
func init() {
	for name, fc := range map[string]flagCase{
		"jwt-audience": {"env-aud", "flag-aud", func(c config) string { return c.JWTAudience }},
		"jwt-issuer":   {"https://env.example", "https://flag.example", func(c config) string { return c.JWTIssuer }},
		"jwt-max-ttl":  {"1h0m0s", "2h0m0s", func(c config) string { return dur(c.JWTMaxTTL) }},
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
	if c, _ := parseConfig(nil, env(), io.Discard); c.jwtAudience() != nil || c.JWTIssuer != "" || c.JWTMaxTTL != 0 {
		t.Errorf("defaults check claims: audience %q, issuer %q, max ttl %v", c.jwtAudience(), c.JWTIssuer, c.JWTMaxTTL)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--jwt-max-ttl", "-1h"}, "--jwt-max-ttl (from the command line): -1h0m0s: must not be negative"},
		{[]string{"--jwt-audience", "pushd"}, "--jwt-audience (from the command line): needs --jwt-secret or --jwt-public-key"},
		{[]string{"--jwt-issuer", "https://login.example"}, "--jwt-issuer (from the command line): needs --jwt-secret or --jwt-public-key"},
	} {
		_, err := parseConfig(tc.args, env(), io.Discard)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: error %v, want one containing %q", tc.args, err, tc.want)
		}
	}
}
