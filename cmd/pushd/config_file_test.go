package main

import (
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// writeConfig writes a config file and returns its path.
func writeConfig(t *testing.T, text string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "pushd.conf")
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestConfigPrecedenceFlagEnvFileDefault(t *testing.T) {
	path := writeConfig(t, `# every layer sets some of these
redis-url = redis://file:6379/0
jwt-secret = file-secret
heartbeat = 11s
drain-timeout = 12s
write-timeout = 13s
log-format = json
`)
	c, err := parseConfig(
		[]string{"--config", path, "--heartbeat", "31s"},
		env("PUSHD_HEARTBEAT", "21s", "PUSHD_DRAIN_TIMEOUT", "22s", "PUSHD_REDIS_URL", "redis://env:6379/0"),
		io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name      string
		got, want any
	}{
		{"heartbeat: flag over env and file", c.Node.Hub.HeartbeatInterval, 31 * time.Second},
		{"drain-timeout: env over file", c.DrainTimeout, 22 * time.Second},
		{"redis-url: env over file", c.Node.RedisURL, "redis://env:6379/0"},
		{"write-timeout: file over default", c.Node.Hub.WriteTimeout, 13 * time.Second},
		{"log-format: file over default", c.LogFormat, "json"},
		{"poll-interval: the default", c.Node.Hub.PollInterval, 2 * time.Second},
	} {
		if tc.got != tc.want {
			t.Errorf("%s: got %v, want %v", tc.name, tc.got, tc.want)
		}
	}

	// PUSHD_CONFIG names the file as well as --config does.
	c, err = parseConfig(nil, env("PUSHD_CONFIG", path), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if c.Node.Hub.HeartbeatInterval != 11*time.Second || c.Node.RedisURL != "redis://file:6379/0" || c.ConfigFile != path {
		t.Errorf("from PUSHD_CONFIG: heartbeat %v redis %q config %q", c.Node.Hub.HeartbeatInterval, c.Node.RedisURL, c.ConfigFile)
	}
	// The --config flag wins over PUSHD_CONFIG like any other flag.
	other := writeConfig(t, "heartbeat = 44s\n")
	if c, err = parseConfig([]string{"--config", other}, env("PUSHD_CONFIG", path), io.Discard); err != nil || c.Node.Hub.HeartbeatInterval != 44*time.Second {
		t.Errorf("--config over PUSHD_CONFIG: heartbeat %v, %v", c.Node.Hub.HeartbeatInterval, err)
	}
}

func TestConfigFileValues(t *testing.T) {
	path := writeConfig(t, "\uFEFF"+`
   # indented comment
jwt-secret = "  spaces kept  "
api-key = abc#def
node-name=n1
allowed-origins =
streams = true
redis-url = redis://r:6379/0
`)
	c, err := parseConfig([]string{"--config", path}, env(), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if c.JWTSecret != "  spaces kept  " || c.Node.APIKey != "abc#def" || c.Node.NodeName != "n1" || c.Origins != "" || !c.Node.Streams {
		t.Errorf("parsed %q %q %q %q %v", c.JWTSecret, c.Node.APIKey, c.Node.NodeName, c.Origins, c.Node.Streams)
	}
}

func TestConfigFileErrors(t *testing.T) {
	for _, tc := range []struct {
		name, text string
		args       []string
		want       []string // each in the error; %F is the file
	}{
		{"no equals sign", "listen = :1\nredis-url\n", nil, []string{"%F:2: want name = value"}},
		{"empty name", " = x\n", nil, []string{"%F:1: want name = value"}},
		{"bad name", "redis url = x\n", nil, []string{`%F:1: "redis url" is not a setting name`}},
		{"unknown key", "redis-uri = redis://r:6379/0\n", nil, []string{`%F:1: unknown setting "redis-uri"`}},
		{"env name as key", "PUSHD_REDIS_URL = redis://r:6379/0\n", nil, []string{`%F:1: unknown setting "PUSHD_REDIS_URL" (keys are flag names: redis-url)`}},
		{"flag syntax as key", "--heartbeat = 1s\n", nil, []string{`(keys are flag names: heartbeat)`}},
		{"config in a config file", "config = other.conf\n", nil, []string{`%F:1: unknown setting "config" (a config file cannot name another)`}},
		{"duplicate", "heartbeat = 1s\n\nheartbeat = 2s\n", nil, []string{"%F:3: heartbeat set again (first on line 1)"}},
		{"unterminated quote", "jwt-secret = \"abc\n", nil, []string{"%F:1: jwt-secret: quoted value"}},
		{"text after quote", "jwt-secret = \"abc\" def\n", nil, []string{"%F:1: jwt-secret: quoted value"}},
		{"bad duration", "heartbeat = soon\n", nil, []string{`--heartbeat (from %F:1): invalid value "soon"`}},
		{"bad bool", "streams = yes please\n", nil, []string{`--streams (from %F:1): invalid value "yes please"`}},
		{"bad value overridden by a flag", "heartbeat = soon\n", []string{"--heartbeat", "1s"}, []string{`--heartbeat (from %F:1): invalid value "soon"`}},
		{"every bad line at once", "heartbeat = soon\nnope = 1\nstreams = maybe\n", nil, []string{"%F:1", "%F:2", "%F:3"}},
		{"semantic check names the line", "drain-timeout = 0s\n", nil, []string{"--drain-timeout (from %F:1): 0s: must be positive"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := writeConfig(t, tc.text)
			_, err := parseConfig(append([]string{"--config", path}, tc.args...), env(), io.Discard)
			for _, w := range tc.want {
				w = strings.ReplaceAll(w, "%F", path)
				if err == nil || !strings.Contains(err.Error(), w) {
					t.Errorf("error %v, want one containing %q", err, w)
				}
			}
		})
	}

	_, err := parseConfig(nil, env("PUSHD_CONFIG", "/nonexistent/pushd.conf"), io.Discard)
	if want := "--config (from PUSHD_CONFIG): open /nonexistent/pushd.conf"; err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("missing file: %v, want %q", err, want)
	}
}

// TestBadSettingsNameTheSettingAndOrigin is the table of bad values: each
// error names the setting and where its value came from.
func TestBadSettingsNameTheSettingAndOrigin(t *testing.T) {
	for _, tc := range []struct {
		setting, value string
		want           string // after "--setting (from origin): "
		needs          []string
	}{
		{"listen", "8080", `"8080": want host:port`, nil},
		{"listen", ":http", "port must be a number", nil},
		{"listen", ":70000", "port must be a number from 0 to 65535", nil},
		{"debug-listen", "localhost", "want host:port", nil},
		{"redis-url", "http://r:6379", `scheme "http"; want redis://host:6379/0`, nil},
		{"redis-url", "redis://r:port/0", `invalid port ":port" after host; want redis://host:6379/0`, nil},
		{"redis-cache-url", "redis://r:6379/x", "invalid database number", []string{"--redis-url", "redis://r:6379/0"}},
		{"redis-control-url", "redis://c:6379/0", "needs --redis-url", nil},
		{"redis-realtime-url", "redis://c:6379/0", "needs --redis-url", nil},
		{"database-url", "postgres://h:notaport/db", "; want postgres://user@host:5432/db", []string{"--redis-url", "redis://r:6379/0"}},
		{"database-url", "postgres://h/db", "needs --redis-url", nil},
		{"streams", "true", "needs --redis-url", nil},
		{"trusted-proxies", "10.0.0.0/8,lb.example", `"lb.example": want IP addresses or CIDRs`, nil},
		{"admin-hosts", "pushd-admin.monitoring.svc,pushd-admin:9464", `"pushd-admin:9464": want DNS names without a port`, nil},
		{"admin-hosts", "*.svc", `"*.svc": want DNS names`, nil},
		{"redis-cluster", "true", "needs --redis-url with the cluster's seed nodes", nil},
		{"redis-url", "redis://a:1,http://b:2", `seed 2: scheme "http"; want host:6379 or redis://host:6379`, []string{"--redis-cluster"}},
		{"redis-url", " , ", "no seed node", []string{"--redis-cluster"}},
		{"redis-cache-url", "redis://c:6379/0", "with --redis-cluster the cluster serves every role", []string{"--redis-cluster", "--redis-url", "a:1,b:2"}},
		{"streams", "true", "one Redis", []string{"--redis-url", "redis://r:6379/0", "--redis-cache-url", "redis://c:6379/0"}},
		{"jwt-public-key", "/nonexistent/key.pem", "no such file", nil},
		{"jwt-public-key", "testdata", "not a regular file", nil},
		{"jwt-public-key", "testdata/env-key.pem", "not both", []string{"--jwt-secret", "s"}},
		{"jwt-algorithm", "HS512", `"HS512": want HS256, RS256, ES256 or EdDSA`, nil},
		{"log-level", "loud", `"loud": want debug, info, warn or error`, nil},
		{"log-format", "xml", `"xml": want text or json`, nil},
		{"heartbeat", "0s", "0s: must be positive", nil},
		{"poll-interval", "-1s", "must be positive", nil},
		{"write-timeout", "0s", "must be positive", nil},
		{"sse-retry", "0s", "must be positive", nil},
		{"drain-timeout", "0s", "must be positive", nil},
		{"reconnect-after", "0s", "must be positive", nil},
		{"stream-maxlen", "0", "must be positive", nil},
		{"max-conns", "-1", "must not be negative", nil},
		{"max-conns-per-ip", "-1", "must not be negative", nil},
		{"request-timeout", "0s", "must be positive", nil},
		{"max-header-bytes", "0", "must be positive", nil},
		{"max-url-bytes", "-1", "must be positive", nil},
		{"max-url-bytes", "70000", "must not exceed --max-header-bytes (65536)", nil},
		{"connect-user-rate", "NaN", "must be a number", nil},
		{"connect-ip-rate", "-1", "must not be negative", nil},
		{"api-window", "0s", "must be positive", nil},
		{"lease-renew-interval", "40s", "shorter than --lease-ttl", nil},
		{"expected-nodes", "0", "at least 1", nil},
		{"default-plan", "gold", `"gold": want free, pro or enterprise`, nil},
	} {
		t.Run(tc.setting+"="+tc.value, func(t *testing.T) {
			for _, origin := range []string{"flag", "env", "file"} {
				var args []string
				getenv := env()
				from := "the command line"
				switch origin {
				case "flag":
					args = []string{"--" + tc.setting + "=" + tc.value}
				case "env":
					getenv = env(envName(tc.setting), tc.value)
					from = envName(tc.setting)
				case "file":
					path := writeConfig(t, "# a comment first, so the line number is 2\n"+tc.setting+" = "+tc.value+"\n")
					args = []string{"--config", path}
					from = path + ":2"
				}
				_, err := parseConfig(append(args, tc.needs...), getenv, io.Discard)
				want := "--" + tc.setting + " (from " + from + "): "
				if err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), tc.want) {
					t.Errorf("%s: error %v, want one containing %q and %q", origin, err, want, tc.want)
				}
			}
		})
	}
}

// TestSecretsStayOutOfMessages: a URL's password must not reach a log.
func TestSecretsStayOutOfMessages(t *testing.T) {
	for _, args := range [][]string{
		{"--redis-url", "redis://u:hunter2@r:port/0"},
		{"--redis-url", "redis://r:6379/0", "--database-url", "postgres://u:hunter2@h:port/db"},
	} {
		_, err := parseConfig(args, env(), io.Discard)
		if err == nil || strings.Contains(err.Error(), "hunter2") {
			t.Errorf("%v: error %v, want one without the password", args, err)
		}
	}
}
