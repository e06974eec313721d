// Package deploy_test checks the Dockerfile, the Compose file, the load
// balancer's configuration and the Helm chart. No Docker engine or cluster
// is reachable where pushd is developed or tested, so they are parsed here
// (with the parsers docker build, docker compose and helm use) instead of
// built or installed, and the settings the operations docs promise are
// asserted.
package deploy_test

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/compose-spec/compose-go/v2/loader"
	"github.com/compose-spec/compose-go/v2/types"
	"github.com/moby/buildkit/frontend/dockerfile/instructions"
	"github.com/moby/buildkit/frontend/dockerfile/parser"
)

func TestDockerfile(t *testing.T) {
	f, err := os.Open("../Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	res, err := parser.Parse(f)
	if err != nil {
		t.Fatalf("Dockerfile: %v", err)
	}
	for _, w := range res.Warnings {
		t.Errorf("Dockerfile warning: %s", w.Short)
	}
	// instructions.Parse is what docker build runs next: it rejects unknown
	// instructions and bad flags and arguments.
	stages, _, err := instructions.Parse(res.AST, nil)
	if err != nil {
		t.Fatalf("Dockerfile: %v", err)
	}
	if len(stages) < 2 {
		t.Fatalf("%d stages, want a builder and a final stage", len(stages))
	}
	build, final := stages[0], stages[len(stages)-1]
	if !strings.HasPrefix(build.BaseName, "golang:") || build.Name != "build" {
		t.Errorf("first stage %q AS %q, want golang:… AS build", build.BaseName, build.Name)
	}
	if !strings.HasPrefix(final.BaseName, "gcr.io/distroless/static") && final.BaseName != "scratch" {
		t.Errorf("final stage from %q, want distroless static or scratch", final.BaseName)
	}

	var buildCmd string
	for _, cmd := range build.Commands {
		if run, ok := cmd.(*instructions.RunCommand); ok {
			if s := strings.Join(run.CmdLine, " "); strings.Contains(s, "go build") {
				buildCmd = s
			}
		}
	}
	// RUN --mount flags are resolved only while building; the syntax tree
	// keeps them as written.
	cacheMounts := 0
	for _, n := range res.AST.Children {
		if strings.EqualFold(n.Value, "from") && cacheMounts > 0 {
			break // the builder's instructions end here
		}
		for _, fl := range n.Flags {
			if strings.EqualFold(n.Value, "run") && strings.HasPrefix(fl, "--mount=type=cache,") {
				cacheMounts++
			}
		}
	}
	if cacheMounts < 2 {
		t.Errorf("%d cache mounts in the builder, want the module and build caches", cacheMounts)
	}
	for _, want := range []string{"CGO_ENABLED=0", "-trimpath", "-s -w", "-X main.version=", "-X main.commit=", "./cmd/pushd"} {
		if !strings.Contains(buildCmd, want) {
			t.Errorf("go build command %q lacks %q", buildCmd, want)
		}
	}

	var user string
	var exposed []string
	copied := false
	for _, cmd := range final.Commands {
		switch c := cmd.(type) {
		case *instructions.UserCommand:
			user = c.User
		case *instructions.ExposeCommand:
			exposed = append(exposed, c.Ports...)
		case *instructions.CopyCommand:
			copied = copied || c.From == build.Name
		case *instructions.RunCommand:
			t.Errorf("RUN in the final stage: it has no shell")
		}
	}
	if u, _, _ := strings.Cut(user, ":"); u == "" || u == "0" || u == "root" {
		t.Errorf("final stage runs as %q, want a non-root user", user)
	}
	if !slices.Contains(exposed, "8080") {
		t.Errorf("final stage exposes %v, want 8080", exposed)
	}
	if !copied {
		t.Errorf("final stage copies nothing from the %s stage", build.Name)
	}
}

// loadCompose loads and validates a Compose file against the Compose
// specification's schema, as docker compose config does.
func loadCompose(t *testing.T, path string) *types.Project {
	t.Helper()
	abs, err := filepath.Abs(path)
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(abs)
	if err != nil {
		t.Fatal(err)
	}
	p, err := loader.LoadWithContext(context.Background(), types.ConfigDetails{
		WorkingDir:  filepath.Dir(abs),
		ConfigFiles: []types.ConfigFile{{Filename: abs, Content: b}},
		Environment: types.Mapping{},
	})
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return p
}

func TestComposeFile(t *testing.T) {
	p := loadCompose(t, "compose.yaml")
	want := []string{"lb", "postgres", "pushd-1", "pushd-2", "redis"}
	if got := p.ServiceNames(); !slices.Equal(sorted(got), want) {
		t.Fatalf("services %v, want %v", got, want)
	}
	for _, name := range []string{"pushd-1", "pushd-2"} {
		s := p.Services[name]
		if s.Build == nil || s.Build.Dockerfile != "Dockerfile" {
			t.Errorf("%s does not build the Dockerfile: %+v", name, s.Build)
		}
		env := s.Environment
		for _, k := range []string{"PUSHD_REDIS_URL", "PUSHD_DATABASE_URL", "PUSHD_NODE_NAME"} {
			if v := env[k]; v == nil || *v == "" {
				t.Errorf("%s: %s unset", name, k)
			}
		}
		if v := env["PUSHD_NODE_NAME"]; v == nil || *v != name {
			t.Errorf("%s: PUSHD_NODE_NAME %v, want %s", name, v, name)
		}
	}
	migrations := false
	for _, v := range p.Services["postgres"].Volumes {
		migrations = migrations || (v.Target == "/docker-entrypoint-initdb.d" && strings.HasSuffix(v.Source, "/db/migrations"))
	}
	if !migrations {
		t.Errorf("postgres does not mount db/migrations at /docker-entrypoint-initdb.d")
	}
	lbConf := false
	for _, v := range p.Services["lb"].Volumes {
		lbConf = lbConf || (v.Target == "/etc/nginx/nginx.conf" && strings.HasSuffix(v.Source, "/deploy/nginx.conf"))
	}
	if !lbConf {
		t.Errorf("lb does not mount deploy/nginx.conf")
	}
}

func sorted(s []string) []string {
	s = slices.Clone(s)
	slices.Sort(s)
	return s
}

// TestNginxPassesStreamsUnbuffered checks the settings SSE and WebSocket
// need from the balancer, and that it balances the Compose file's nodes.
func TestNginxPassesStreamsUnbuffered(t *testing.T) {
	b, err := os.ReadFile("nginx.conf")
	if err != nil {
		t.Fatal(err)
	}
	conf := string(b)
	if strings.Count(conf, "{") != strings.Count(conf, "}") {
		t.Errorf("nginx.conf: unbalanced braces")
	}
	for _, re := range []string{
		`proxy_buffering\s+off;`,
		`proxy_http_version\s+1\.1;`,
		`proxy_set_header\s+Upgrade\s+\$http_upgrade;`,
		`proxy_set_header\s+Connection\s+\$connection_upgrade;`,
		`proxy_read_timeout\s+1h;`,
		`server\s+pushd-1:8080`,
		`server\s+pushd-2:8080`,
	} {
		if !regexp.MustCompile(re).MatchString(conf) {
			t.Errorf("nginx.conf lacks %s", re)
		}
	}
}

// The balancer passes the client routes only: the one location that
// proxies matches the protocol, the client, the index and the health
// checks, never /metrics, /debug/ or /demo/; every other path is a 404
// of its own.
func TestNginxPassesClientRoutesOnly(t *testing.T) {
	b, err := os.ReadFile("nginx.conf")
	if err != nil {
		t.Fatal(err)
	}
	conf := string(b)
	proxied := regexp.MustCompile(`location ~ (\S+) \{\s*proxy_pass`).FindAllStringSubmatch(conf, -1)
	if len(proxied) != 1 || strings.Count(conf, "proxy_pass") != 1 {
		t.Fatalf("nginx.conf proxies in %d regex locations (%d proxy_pass), want exactly one", len(proxied), strings.Count(conf, "proxy_pass"))
	}
	route := regexp.MustCompile(proxied[0][1])
	for _, path := range []string{"/v1/events", "/v1/ws", "/v1/tasks/t1", "/v1/publish", "/client/pushd.js", "/healthz", "/readyz", "/"} {
		if !route.MatchString(path) {
			t.Errorf("nginx.conf does not pass %s", path)
		}
	}
	for _, path := range []string{"/metrics", "/debug/pprof/", "/demo/", "/demo/token", "/healthzx", "/v1", "/metrics/"} {
		if route.MatchString(path) {
			t.Errorf("nginx.conf passes %s", path)
		}
	}
	if !regexp.MustCompile(`location / \{\s*default_type application/json;\s*return 404`).MatchString(conf) {
		t.Errorf("nginx.conf answers other paths otherwise than with its own 404")
	}
}
