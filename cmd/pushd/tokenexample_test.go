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

// protocolDoc holds the token examples, under "Issuing tokens".
const protocolDoc = "../../docs/PROTOCOL.md"

// TestTokenExampleInGo: docs/PROTOCOL.md's Go example is issueToken
// above, character for character, and a node with the settings it names
// accepts its tokens.
func TestTokenExampleInGo(t *testing.T) {
	src, err := os.ReadFile("tokenexample_test.go")
	if err != nil {
		t.Fatal(err)
	}
	_, fn, _ := strings.Cut(string(src), "\n// issueToken signs")
	fn, _, _ = strings.Cut(fn, "\n}\n")
	fn = "// issueToken signs" + fn + "\n}\n"
	doc, err := os.ReadFile(protocolDoc)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(doc), "```go\n"+fn+"```\n") {
		t.Errorf("docs/PROTOCOL.md's Go token example differs from issueToken in tokenexample_test.go:\n%s", fn)
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

// TestTokenExampleInNode runs docs/PROTOCOL.md's JavaScript example with
// node, as written, and checks that a node with the settings it names
// accepts the token it prints.
func TestTokenExampleInNode(t *testing.T) {
	node, err := exec.LookPath("node")
	if err != nil {
		t.Fatalf("the JavaScript token example needs node (scripts/test installs it): %v", err)
	}
	js := fencedBlock(t, protocolDoc, "the standard\nlibrary is enough for HS256:", "js")
	if !strings.HasPrefix(js, "// issue-token.mjs") {
		t.Fatalf("docs/PROTOCOL.md's js block after the HS256 line is not issue-token.mjs:\n%s", js)
	}
	file := filepath.Join(t.TempDir(), "issue-token.mjs")
	if err := os.WriteFile(file, []byte(js), 0o600); err != nil {
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
