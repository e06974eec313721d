package main

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// runCLI runs a command line in this process, as main would, and returns
// what it wrote and its exit status.
func runCLI(t *testing.T, environ []string, stdin string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	var out, errOut bytes.Buffer
	code = cli(args, environ, strings.NewReader(stdin), &out, &errOut)
	return out.String(), errOut.String(), code
}

// runBinaryCmd runs the built binary with args and the PUSHD_* variables
// of env, for commands that exit by themselves.
func runBinaryCmd(t *testing.T, env []string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	cmd := exec.CommandContext(ctx, binary(t), args...)
	cmd.Env = append(envWithoutPushd(), env...)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	var exit *exec.ExitError
	if err != nil && !errors.As(err, &exit) {
		t.Fatalf("pushd %v: %v", args, err)
	}
	return out.String(), errOut.String(), cmd.ProcessState.ExitCode()
}

// TestBinaryCLIConventions: the built binary's exit statuses and streams,
// which main decides: help and the version on stdout with 0, a refused
// command line as one line on stderr with 2.
func TestBinaryCLIConventions(t *testing.T) {
	version, _, code := runBinaryCmd(t, nil, "version")
	if code != 0 || !strings.HasPrefix(version, "pushd ") {
		t.Fatalf("pushd version: exit %d\n%s", code, version)
	}
	for _, args := range [][]string{{"--version"}, {"-version"}} {
		if out, errOut, code := runBinaryCmd(t, nil, args...); code != 0 || out != version || errOut != "" {
			t.Errorf("pushd %v: exit %d, stdout %q, stderr %q; want exit 0 and stdout %q", args, code, out, errOut, version)
		}
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-h"}, "Usage: pushd [flags]"},
		{[]string{"--help"}, "Usage: pushd [flags]"},
		{[]string{"token", "-h"}, "Usage: pushd token --tenant ID"},
		{[]string{"token", "--help"}, "Usage: pushd token --tenant ID"},
		{[]string{"token", "verify", "-h"}, "Usage: pushd token verify [TOKEN|-]"},
		{[]string{"version", "-h"}, "Usage: pushd version"},
	} {
		if out, errOut, code := runBinaryCmd(t, nil, tc.args...); code != 0 || !strings.HasPrefix(out, tc.want) || errOut != "" {
			t.Errorf("pushd %v: exit %d, stderr %q, stdout:\n%s\nwant exit 0 and stdout starting %q", tc.args, code, errOut, out, tc.want)
		}
	}
	for _, tc := range []struct {
		args []string
		want string // all of stderr
	}{
		{[]string{"--heartbeet", "1s"}, "pushd: unknown flag --heartbeet; did you mean --heartbeat? (run pushd -h for the flags)\n"},
		{[]string{"-heartbeet", "1s"}, "pushd: unknown flag --heartbeet; did you mean --heartbeat? (run pushd -h for the flags)\n"},
		{[]string{"--no-such-thing"}, "pushd: unknown flag --no-such-thing (run pushd -h for the flags)\n"},
		{[]string{"--heartbeat", "25"}, "pushd: --heartbeat 25: a duration needs a unit, e.g. 25s\n"},
		{[]string{"--heartbeat"}, "pushd: --heartbeat needs a value (run pushd -h for the flags)\n"},
		{[]string{"--max-conns", "many"}, "pushd: --max-conns many: want a whole number\n"},
		{[]string{"--drain-timeout", "0s"}, "pushd: --drain-timeout (from the command line): 0s: must be positive\n"},
		{[]string{"version", "extra"}, "pushd: version takes no arguments\n"},
		{[]string{"--demo=maybe"}, "pushd: --demo maybe: want true or false\n"},
		{[]string{"tokn", "--tenant", "t1"}, "pushd: unknown command \"tokn\"; did you mean token? (run pushd -h)\n"},
		{[]string{"--listen", ":1", "tokn"}, "pushd: unexpected argument \"tokn\" (run pushd -h for the flags)\n"},
		{[]string{"token", "--tenat", "t1"}, "pushd: unknown flag --tenat; did you mean --tenant? (run pushd token -h for the flags)\n"},
	} {
		if out, errOut, code := runBinaryCmd(t, nil, tc.args...); code != 2 || errOut != tc.want || out != "" {
			t.Errorf("pushd %v: exit %d, stdout %q, stderr %q; want exit 2 and stderr %q", tc.args, code, out, errOut, tc.want)
		}
	}
}

func TestDurationErrorsNameTheUnit(t *testing.T) {
	for _, tc := range []struct {
		args    []string
		environ []string
		want    string
	}{
		{[]string{"--write-timeout", "10"}, nil, "--write-timeout 10: a duration needs a unit, e.g. 10s"},
		{[]string{"--write-timeout", "1.5"}, nil, "--write-timeout 1.5: a duration needs a unit, e.g. 1.5s"},
		{[]string{"--write-timeout", "later"}, nil, "--write-timeout later: not a duration: want a number and a unit, e.g. 25s, 1m30s or 500ms"},
		{nil, env("PUSHD_HEARTBEAT", "25"), `--heartbeat (from PUSHD_HEARTBEAT): invalid value "25": a duration needs a unit, e.g. 25s`},
	} {
		_, err := parseConfig(tc.args, tc.environ, io.Discard)
		if err == nil || err.Error() != tc.want {
			t.Errorf("%v %v: error %v, want %q", tc.args, tc.environ, err, tc.want)
		}
		if !errors.As(err, new(usageError)) {
			t.Errorf("%v %v: error %T is not a usageError (exit 2)", tc.args, tc.environ, err)
		}
	}
}

func TestClosestNamesLikelyTypos(t *testing.T) {
	known := []string{"redis-url", "redis-cluster", "heartbeat", "listen", "PUSHD_REDIS_URL"}
	for name, want := range map[string]string{
		"heartbeet":       "heartbeat",
		"hartbeat":        "heartbeat",
		"redis-ulr":       "redis-url", // neighbours swapped: one edit
		"lsiten":          "listen",
		"PUSHD_REDIS_ULR": "PUSHD_REDIS_URL",
		"pushd_redis_url": "PUSHD_REDIS_URL",
		"database":        "",
		"x":               "",
	} {
		if got := closest(name, known); got != want {
			t.Errorf("closest(%q) = %q, want %q", name, got, want)
		}
	}
}

func TestUnknownEnvironmentVariablesWarn(t *testing.T) {
	c, err := parseConfig(nil, env("PUSHD_REDIS_ULR", "redis://r:6379/0", "PUSHD_ZZZ", "1", "PUSHD_HEARTBEAT", "7s", "HOME", "/root",
		"PUSHD_TEST_REDIS_URL", "redis://t:6379/0", "PUSHD_FUZZ_TIME", "1s"), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, w := range c.warnings {
		got = append(got, w.String())
	}
	want := []string{ // sorted, and not the test suite's own variables
		"unknown environment variable, ignored name=PUSHD_REDIS_ULR did_you_mean=PUSHD_REDIS_URL",
		"unknown environment variable, ignored name=PUSHD_ZZZ",
	}
	if !slices.Equal(got, want) {
		t.Errorf("warnings %q, want %q", got, want)
	}
	if c.Node.RedisURL != "" || c.Node.Hub.HeartbeatInterval.String() != "7s" {
		t.Errorf("redis-url %q heartbeat %v: the misspelt variable must be ignored, the known one read", c.Node.RedisURL, c.Node.Hub.HeartbeatInterval)
	}
}

func TestShortSecretWarns(t *testing.T) {
	short := func(c config) bool {
		for _, w := range c.warnings {
			if strings.HasPrefix(w.msg, "HS256 secret shorter than 32 bytes") {
				return true
			}
		}
		return false
	}
	c, err := parseConfig([]string{"--jwt-secret", "0123456789abcdef0123456789abcde"}, env(), io.Discard)
	if err != nil || !short(c) {
		t.Errorf("31-byte secret: %v, warnings %v; want the short-secret warning", err, c.warnings)
	}
	c, err = parseConfig([]string{"--jwt-secret", "0123456789abcdef0123456789abcdef"}, env(), io.Discard)
	if err != nil || short(c) {
		t.Errorf("32-byte secret: %v, warnings %v; want none", err, c.warnings)
	}
}

// TestBinaryStartWarnsAndServes: the warnings go to the node's log at
// start, and the node serves anyway.
func TestBinaryStartWarnsAndServes(t *testing.T) {
	p := startBinaryEnv(t, []string{"PUSHD_REDIS_ULR=redis://127.0.0.1:6379/0", "PUSHD_JWT_SECRET=short"})
	wantHealthy(t, p.URL)
	log := p.log.String()
	for _, want := range []string{
		`level=WARN msg="unknown environment variable, ignored" name=PUSHD_REDIS_ULR did_you_mean=PUSHD_REDIS_URL`,
		`level=WARN msg="HS256 secret shorter than 32 bytes: a short secret can be guessed, and whoever guesses it mints tokens" setting=jwt-secret from=PUSHD_JWT_SECRET bytes=5`,
		"embedded mode", // the misspelt Redis URL was not read
	} {
		if !strings.Contains(log, want) {
			t.Errorf("start log lacks %q:\n%s", want, log)
		}
	}
}

func TestSecretFiles(t *testing.T) {
	dir := t.TempDir()
	write := func(name, text string) string {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	secret := write("secret", "0123456789abcdef0123456789abcdef\n")
	key := write("key", "publish-key\r\n")
	keep := write("keep", "  blanks kept \n\n")
	empty := write("empty", "\n")

	c, err := parseConfig([]string{"--jwt-secret-file", secret}, env("PUSHD_API_KEY_FILE", key), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if c.JWTSecret != "0123456789abcdef0123456789abcdef" || c.Node.APIKey != "publish-key" {
		t.Errorf("secret %q api key %q: want the files' contents less the trailing newline", c.JWTSecret, c.Node.APIKey)
	}
	conf := writeConfig(t, "jwt-secret-file = "+keep+"\n")
	if c, err = parseConfig([]string{"--config", conf}, env(), io.Discard); err != nil || c.JWTSecret != "  blanks kept \n" {
		t.Errorf("from the config file: secret %q, %v; want one newline trimmed, nothing else", c.JWTSecret, err)
	}

	for _, tc := range []struct {
		args    []string
		environ []string
		want    string
	}{
		{[]string{"--jwt-secret", "s", "--jwt-secret-file", secret}, nil, "--jwt-secret-file (from the command line): set --jwt-secret (from the command line) or --jwt-secret-file, not both"},
		{[]string{"--api-key-file", key}, env("PUSHD_API_KEY", "k"), "--api-key-file (from the command line): set --api-key (from PUSHD_API_KEY) or --api-key-file, not both"},
		{nil, env("PUSHD_JWT_SECRET_FILE", empty), "--jwt-secret-file (from PUSHD_JWT_SECRET_FILE): " + empty + " is empty"},
		{[]string{"--api-key-file", filepath.Join(dir, "missing")}, nil, "--api-key-file (from the command line): open " + filepath.Join(dir, "missing")},
		{[]string{"--jwt-secret-file", secret, "--jwt-public-key", "testdata/flag-key.pem"}, nil, "--jwt-public-key (from the command line): set --jwt-secret (from the file " + secret + ") or --jwt-public-key, not both"},
	} {
		_, err := parseConfig(tc.args, tc.environ, io.Discard)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v %v: error %v, want one containing %q", tc.args, tc.environ, err, tc.want)
		}
	}
}

// TestEveryBadSettingAtOnce: a bad value from the environment, a bad line
// of the file and a setting validation refuses are reported together.
func TestEveryBadSettingAtOnce(t *testing.T) {
	conf := writeConfig(t, "hartbeat = 5s\nstream-maxlen = lots\n")
	_, err := parseConfig([]string{"--config", conf, "--drain-timeout", "0s"}, env("PUSHD_POLL_INTERVAL", "2"), io.Discard)
	if err == nil {
		t.Fatal("no error")
	}
	for _, want := range []string{
		`--poll-interval (from PUSHD_POLL_INTERVAL): invalid value "2": a duration needs a unit, e.g. 2s`,
		conf + `:1: unknown setting "hartbeat"`,
		`--stream-maxlen (from ` + conf + `:2): invalid value "lots"`,
		`--drain-timeout (from the command line): 0s: must be positive`,
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q:\n%v", want, err)
		}
	}
}
