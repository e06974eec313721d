package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
)

// issueToken signs a token for user of tenant, for nodes run with
// --jwt-secret, --jwt-audience pushd and --jwt-issuer https://login.example.
// The token sees the user's own tasks and those of projects ("*": all).
func issueToken(secret []byte, tenant, user, plan string, projects []string) (string, error) {
	now := time.Now()
	claims := jwt.MapClaims{
		"sub":       user,
		"tenant_id": tenant,
		"projects":  projects, // leave it out for the user's own tasks only
		"plan":      plan,     // leave it out for the tenant's configured plan
		"aud":       "pushd",
		"iss":       "https://login.example",
		"iat":       now.Unix(),
		"exp":       now.Add(15 * time.Minute).Unix(), // within --jwt-max-ttl
	}
	return jwt.NewWithClaims(jwt.SigningMethodHS256, claims).SignedString(secret)
}

// TestREADMETokenExample: the README's Go example is issueToken above,
// character for character, and a node with the settings it names accepts
// its tokens.
func TestREADMETokenExample(t *testing.T) {
	src, err := os.ReadFile("readme_token_test.go")
	if err != nil {
		t.Fatal(err)
	}
	_, fn, _ := strings.Cut(string(src), "\n// issueToken signs")
	fn, _, _ = strings.Cut(fn, "\n}\n")
	fn = "// issueToken signs" + fn + "\n}\n"
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(readme), "```go\n"+fn+"```\n") {
		t.Errorf("README.md's Go token example differs from issueToken in readme_token_test.go:\n%s", fn)
	}

	tok, err := issueToken([]byte(tokenSecret), "t1", "u1", "pro", []string{"p1", "p2"})
	if err != nil {
		t.Fatal(err)
	}
	out, errOut, code := runCLI(t, env("PUSHD_JWT_SECRET", tokenSecret), "", append([]string{"token", "verify", tok}, tokenNodeFlags...)...)
	if code != 0 || !strings.Contains(errOut, "token valid: tenant t1, user u1, sees projects p1,p2 and its own tasks, plan pro, HS256") {
		t.Fatalf("pushd token verify: exit %d, stderr %q, stdout %q", code, errOut, out)
	}
}

// TestREADMENodeTokenExample runs the README's JavaScript example with
// node, as written, and checks that a node with the settings it names
// accepts the token it prints.
func TestREADMENodeTokenExample(t *testing.T) {
	node, err := exec.LookPath("node")
	if err != nil {
		t.Fatalf("the README's JavaScript example needs node (scripts/test installs it): %v", err)
	}
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, js, ok := strings.Cut(string(readme), "```js\n// issue-token.mjs")
	js, _, closed := strings.Cut(js, "```\n")
	if !ok || !closed {
		t.Fatal("README.md has no closed js block starting with // issue-token.mjs")
	}
	file := filepath.Join(t.TempDir(), "issue-token.mjs")
	if err := os.WriteFile(file, []byte("// issue-token.mjs"+js), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(node, file)
	cmd.Env = append(os.Environ(), "PUSHD_JWT_SECRET="+tokenSecret)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("node issue-token.mjs: %v", err)
	}
	tok := strings.TrimSpace(string(out))
	stdout, errOut, code := runCLI(t, env("PUSHD_JWT_SECRET", tokenSecret), "", append([]string{"token", "verify", tok}, tokenNodeFlags...)...)
	if code != 0 || !strings.Contains(errOut, "token valid: tenant t1, user u1, sees projects p1,p2 and its own tasks, plan pro, HS256") {
		t.Fatalf("pushd token verify of the node example's token: exit %d, stderr %q, stdout %q", code, errOut, stdout)
	}
}
