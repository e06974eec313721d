package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/golang-jwt/jwt/v5"
)

const tokenSecret = "0123456789abcdef0123456789abcdef"

// tokenNodeFlags restrict tokens the way a production node would, so a
// minted token must carry every claim they check.
var tokenNodeFlags = []string{"--jwt-audience", "pushd", "--jwt-issuer", "https://login.example", "--jwt-max-ttl", "1h"}

// mint runs pushd token from the binary and returns what it printed, which
// must be the token alone.
func mint(t *testing.T, env []string, args ...string) string {
	t.Helper()
	out, errOut, code := runBinaryCmd(t, env, append([]string{"token"}, args...)...)
	if code != 0 || errOut != "" {
		t.Fatalf("pushd token %v: exit %d\n%s", args, code, errOut)
	}
	tok, ok := strings.CutSuffix(out, "\n")
	if !ok || strings.Count(tok, ".") != 2 || strings.ContainsAny(tok, " \n") {
		t.Fatalf("pushd token printed %q, want one JWT and a newline", out)
	}
	return tok
}

// writeECKeys writes a fresh P-256 key pair as PEM files and returns their
// paths.
func writeECKeys(t *testing.T) (private, public string) {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	privDER, err := x509.MarshalPKCS8PrivateKey(k)
	if err != nil {
		t.Fatal(err)
	}
	pubDER, err := x509.MarshalPKIXPublicKey(k.Public())
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	private, public = filepath.Join(dir, "private.pem"), filepath.Join(dir, "public.pem")
	if err := os.WriteFile(private, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: privDER}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(public, pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pubDER}), 0o600); err != nil {
		t.Fatal(err)
	}
	return private, public
}

// TestMintedTokenWorksOverSSEWebSocketAndHTTP is the test of record for
// pushd token: a node with a production secret, audience, issuer and
// lifetime limit accepts the token the command mints from the same
// settings, over every authenticated transport, and refuses one minted
// for another secret.
func TestMintedTokenWorksOverSSEWebSocketAndHTTP(t *testing.T) {
	nodeEnv := []string{"PUSHD_JWT_SECRET=" + tokenSecret}
	p := startBinaryEnv(t, nodeEnv, tokenNodeFlags...)
	tok := mint(t, nodeEnv, append([]string{"--tenant", "t1", "--user", "u1", "--plan", "pro", "--ttl", "10m"}, tokenNodeFlags...)...)
	publish(t, p.URL, 1, "RUNNING", 45)

	// HTTP: a snapshot read.
	resp, body := httpDo(t, http.MethodGet, p.URL+"/v1/tasks/task_1", tok, "")
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /v1/tasks/task_1 with the minted token: %d %s", resp.StatusCode, body)
	}
	var task taskDoc
	decode(t, body, &task)
	if task.TaskID != "task_1" || task.Version != 1 {
		t.Fatalf("GET /v1/tasks/task_1 answered %s", body)
	}
	other := mint(t, []string{"PUSHD_JWT_SECRET=another-secret-0123456789abcdef0123"}, append([]string{"--tenant", "t1", "--user", "u1"}, tokenNodeFlags...)...)
	if resp, body := httpDo(t, http.MethodGet, p.URL+"/v1/tasks/task_1", other, ""); resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("GET /v1/tasks/task_1 with a token of another secret: %d %s, want 401", resp.StatusCode, body)
	}

	// SSE.
	sse := openSSE(t, p.URL, "/v1/events?task=task_1", tok)
	sse.NextOf(t, "hello")
	wantTask(t, sse, 1, "RUNNING", 45)

	// WebSocket, the token in the query as a browser sends it.
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	ws, resp, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(p.URL, "http")+"/v1/ws?access_token="+url.QueryEscape(tok),
		&websocket.DialOptions{HTTPClient: client, Subprotocols: []string{"pushd.v1"}})
	if err != nil {
		t.Fatalf("WebSocket with the minted token: %v (%v)", err, resp)
	}
	defer ws.CloseNow()
	if err := ws.Write(ctx, websocket.MessageText, []byte(`{"op":"subscribe","id":1,"tasks":["task_1"]}`)); err != nil {
		t.Fatal(err)
	}
	publish(t, p.URL, 2, "SUCCEEDED", 100)
	wantTask(t, sse, 2, "SUCCEEDED", 100)
	var types []string
	for {
		_, b, err := ws.Read(ctx)
		if err != nil {
			t.Fatalf("WebSocket read after %v: %v", types, err)
		}
		var m struct {
			Type string  `json:"type"`
			Task taskDoc `json:"task"`
		}
		decode(t, b, &m)
		types = append(types, m.Type)
		if m.Type == "error" {
			t.Fatalf("WebSocket error: %s", b)
		}
		if m.Type == "task" && m.Task.Version == 2 {
			break
		}
	}
	if types[0] != "hello" {
		t.Errorf("WebSocket messages %v, want hello first", types)
	}
	ws.Close(websocket.StatusNormalClosure, "")
}

// TestMintedPublicKeyTokenWorks: with --jwt-public-key the node holds no
// signing key, so pushd token signs with --private-key; a private key
// that is not the public key's is caught before any token is printed.
func TestMintedPublicKeyTokenWorks(t *testing.T) {
	private, public := writeECKeys(t)
	p := startBinary(t, append([]string{"--jwt-public-key", public}, tokenNodeFlags...)...)
	publish(t, p.URL, 1, "RUNNING", 45)
	nodeEnv := []string{"PUSHD_JWT_PUBLIC_KEY=" + public}
	tok := mint(t, nodeEnv, append([]string{"--tenant", "t1", "--user", "u1", "--private-key", private}, tokenNodeFlags...)...)
	if resp, body := httpDo(t, http.MethodGet, p.URL+"/v1/tasks/task_1", tok, ""); resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /v1/tasks/task_1 with the minted ES256 token: %d %s", resp.StatusCode, body)
	}

	otherPrivate, _ := writeECKeys(t)
	out, errOut, code := runBinaryCmd(t, nodeEnv, "token", "--tenant", "t1", "--user", "u1", "--private-key", otherPrivate)
	if want := "pushd: the node would refuse the token: the signature does not match the public key --jwt-public-key " + public + " (from PUSHD_JWT_PUBLIC_KEY)\n"; code != 1 || out != "" || errOut != want {
		t.Errorf("mint with another private key: exit %d, stdout %q, stderr %q; want exit 1 and %q", code, out, errOut, want)
	}
	_, errOut, code = runBinaryCmd(t, nodeEnv, "token", "--tenant", "t1", "--user", "u1")
	if code != 2 || !strings.Contains(errOut, "signing needs its private key: --private-key FILE") {
		t.Errorf("mint without a private key: exit %d, stderr %q", code, errOut)
	}
}

func TestTokenMintRefusals(t *testing.T) {
	secret := env("PUSHD_JWT_SECRET", tokenSecret)
	for _, tc := range []struct {
		environ []string
		args    []string
		want    string
	}{
		{secret, []string{"--user", "u1"}, `pushd: --tenant "": want an id of letters, digits and _ - . : (required)`},
		{secret, []string{"--tenant", "t 1", "--user", "u1"}, `pushd: --tenant "t 1": want an id`},
		{secret, []string{"--tenant", "t1"}, `pushd: --user "": want an id`},
		{secret, []string{"--tenant", "t1", "--user", "u1", "--plan", "gold"}, `pushd: --plan "gold": want free, pro or enterprise`},
		{secret, []string{"--tenant", "t1", "--user", "u1", "--ttl", "2h", "--jwt-max-ttl", "1h"}, "pushd: --ttl 2h0m0s is longer than --jwt-max-ttl 1h0m0s (from the command line): the node would refuse the token"},
		{secret, []string{"--tenant", "t1", "--user", "u1", "--ttl", "90"}, "pushd: --ttl 90: a duration needs a unit, e.g. 90s"},
		{nil, []string{"--tenant", "t1", "--user", "u1"}, "pushd: no --jwt-secret or --jwt-public-key"},
		{secret, []string{"--tenant", "t1", "--user", "u1", "--private-key", "testdata/flag-key.pem"}, "pushd: --private-key signs RS256, ES256 or EdDSA tokens, but the node verifies HS256 with --jwt-secret (from PUSHD_JWT_SECRET)"},
		{secret, []string{"--tenant", "t1", "--user", "u1", "extra"}, `pushd: unexpected argument "extra"`},
		{secret, []string{"--tenant", "t1", "--user", "u1", "--projects", "p1,*"}, `pushd: --projects "p1,*": invalid projects: "*" is not a project id`},
	} {
		out, errOut, code := runCLI(t, tc.environ, "", append([]string{"token"}, tc.args...)...)
		if code != 2 || out != "" || !strings.HasPrefix(errOut, tc.want) {
			t.Errorf("pushd token %v: exit %d, stdout %q, stderr %q; want exit 2 and %q", tc.args, code, out, errOut, tc.want)
		}
	}
}

// TestTokenMintClaims: the token carries what the node checks, and its
// lifetime defaults to an hour, or --jwt-max-ttl when shorter.
func TestTokenMintClaims(t *testing.T) {
	claimsOf := func(t *testing.T, tok string) jwt.MapClaims {
		t.Helper()
		var mc jwt.MapClaims
		if _, _, err := jwt.NewParser().ParseUnverified(tok, &mc); err != nil {
			t.Fatal(err)
		}
		return mc
	}
	secret := env("PUSHD_JWT_SECRET", tokenSecret)
	out, errOut, code := runCLI(t, secret, "", append([]string{"token", "--tenant", "t1", "--user", "u1", "--plan", "enterprise"}, tokenNodeFlags...)...)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	mc := claimsOf(t, strings.TrimSpace(out))
	exp, _ := mc.GetExpirationTime()
	iat, _ := mc.GetIssuedAt()
	aud, _ := mc.GetAudience()
	if mc["tenant_id"] != "t1" || mc["sub"] != "u1" || mc["plan"] != "enterprise" || !slices.Equal(aud, []string{"pushd"}) || mc["iss"] != "https://login.example" || exp.Sub(iat.Time) != time.Hour {
		t.Errorf("claims %v, want t1, u1, enterprise, aud pushd, iss https://login.example, a 1h lifetime", mc)
	}
	out, _, _ = runCLI(t, secret, "", "token", "--tenant", "t1", "--user", "u1", "--jwt-max-ttl", "15m")
	mc = claimsOf(t, strings.TrimSpace(out))
	exp, _ = mc.GetExpirationTime()
	iat, _ = mc.GetIssuedAt()
	_, hasProjects := mc["projects"]
	if _, has := mc["plan"]; has || hasProjects || exp.Sub(iat.Time) != 15*time.Minute {
		t.Errorf("claims %v, want no plan, no projects and the 15m of --jwt-max-ttl", mc)
	}
	for flag, want := range map[string][]any{"p2,p1,p2": {"p1", "p2"}, "*": {"*"}} {
		out, errOut, code := runCLI(t, secret, "", append([]string{"token", "--tenant", "t1", "--user", "u1", "--projects", flag}, tokenNodeFlags...)...)
		if code != 0 {
			t.Fatalf("--projects %s: exit %d: %s", flag, code, errOut)
		}
		if got, _ := claimsOf(t, strings.TrimSpace(out))["projects"].([]any); !slices.Equal(got, want) {
			t.Errorf("--projects %s: claim %v, want %v", flag, got, want)
		}
	}
}

// TestTokenVerifyExplains is the test of record for pushd token verify:
// it answers as the node's verifier does and names the reason.
func TestTokenVerifyExplains(t *testing.T) {
	now := time.Now()
	claims := func(edit func(jwt.MapClaims)) jwt.MapClaims {
		c := jwt.MapClaims{"sub": "u1", "tenant_id": "t1", "aud": "pushd", "iss": "https://login.example",
			"iat": now.Unix(), "exp": now.Add(10 * time.Minute).Unix()}
		if edit != nil {
			edit(c)
		}
		return c
	}
	sign := func(method jwt.SigningMethod, key any, c jwt.MapClaims) string {
		s, err := jwt.NewWithClaims(method, c).SignedString(key)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	hs := func(c jwt.MapClaims) string { return sign(jwt.SigningMethodHS256, []byte(tokenSecret), c) }
	ecKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	expiredAt := now.Add(-time.Hour)
	nodeEnv := env("PUSHD_JWT_SECRET", tokenSecret)

	good := hs(claims(nil))
	out, errOut, code := runCLI(t, nodeEnv, "", append([]string{"token", "verify", good}, tokenNodeFlags...)...)
	var body map[string]any
	if code != 0 || json.Unmarshal([]byte(out), &body) != nil || body["tenant_id"] != "t1" || body["sub"] != "u1" || body["aud"] != "pushd" {
		t.Fatalf("verify a good token: exit %d, stdout %q, stderr %q; want 0 and its claims as JSON", code, out, errOut)
	}
	if !strings.HasPrefix(errOut, "pushd: token valid: tenant t1, user u1, sees its own tasks only, plan (the tenant's configured plan), HS256, expires ") {
		t.Errorf("verify a good token: stderr %q", errOut)
	}
	// - and no argument read the token from stdin; flags may come first.
	for _, args := range [][]string{{"token", "verify", "-"}, append([]string{"token", "verify"}, tokenNodeFlags...)} {
		if _, errOut, code := runCLI(t, nodeEnv, good+"\n", append(args, tokenNodeFlags...)...); code != 0 {
			t.Errorf("verify %v from stdin: exit %d, %s", args, code, errOut)
		}
	}

	for _, tc := range []struct {
		name, token string
		want        string // stderr
	}{
		{"expired", hs(claims(func(c jwt.MapClaims) { c["exp"], c["iat"] = expiredAt.Unix(), expiredAt.Add(-time.Minute).Unix() })),
			"pushd: token refused: expired at " + expiredAt.UTC().Format(time.RFC3339) + ", "},
		{"mis-signed", sign(jwt.SigningMethodHS256, []byte("another-secret-0123456789abcdef0123"), claims(nil)),
			"pushd: token refused: the signature does not match the secret --jwt-secret (from PUSHD_JWT_SECRET)\n"},
		{"another algorithm", sign(jwt.SigningMethodES256, ecKey, claims(nil)),
			"pushd: token refused: signed with ES256, but this node takes HS256 (the secret --jwt-secret (from PUSHD_JWT_SECRET))\n"},
		{"wrong audience", hs(claims(func(c jwt.MapClaims) { c["aud"] = "billing" })),
			`pushd: token refused: aud ["billing"] names none of --jwt-audience pushd (from the command line)` + "\n"},
		{"wrong issuer", hs(claims(func(c jwt.MapClaims) { c["iss"] = "https://other.example" })),
			`pushd: token refused: iss "https://other.example" is not --jwt-issuer https://login.example (from the command line)` + "\n"},
		{"lifetime above the max", hs(claims(func(c jwt.MapClaims) { c["exp"] = now.Add(2 * time.Hour).Unix() })),
			"pushd: token refused: lifetime 2h0m0s (exp - iat) is longer than --jwt-max-ttl 1h0m0s (from the command line)\n"},
		{"no exp", hs(claims(func(c jwt.MapClaims) { delete(c, "exp") })),
			"pushd: token refused: missing claim exp (every token needs an expiry)\n"},
		{"no aud", hs(claims(func(c jwt.MapClaims) { delete(c, "aud") })),
			"pushd: token refused: missing claim aud (--jwt-audience pushd, from the command line)\n"},
		{"no tenant", hs(claims(func(c jwt.MapClaims) { delete(c, "tenant_id") })),
			"pushd: token refused: missing claim tenant_id (the tenant)\n"},
		{"bad projects", hs(claims(func(c jwt.MapClaims) { c["projects"] = []string{"p1", "*"} })),
			`pushd: token refused: projects []interface {}{"p1", "*"}: want up to 100 project ids, or ["*"] alone for every project` + "\n"},
		{"bad user", hs(claims(func(c jwt.MapClaims) { c["sub"] = "u 1" })),
			`pushd: token refused: sub "u 1" (the user) is not an id of letters, digits and _ - . :` + "\n"},
		{"not a JWT", "a.b.c", "pushd: token refused: not a JWT (three base64url parts joined by dots, the middle one a JSON object)\n"},
		{"a session token", "opaque-session-token", "pushd: token refused: not a JWT; a session token is looked up in Redis and PostgreSQL, which verify does not do\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, errOut, code := runCLI(t, nodeEnv, "", append([]string{"token", "verify", tc.token}, tokenNodeFlags...)...)
			if code != 1 || out != "" || !strings.HasPrefix(errOut, tc.want) {
				t.Errorf("exit %d, stdout %q, stderr %q; want exit 1 and %q", code, out, errOut, tc.want)
			}
		})
	}

	// With a public key, a mis-signed token names the key file.
	_, public := writeECKeys(t)
	_, errOut, code = runCLI(t, nil, "", "token", "verify", sign(jwt.SigningMethodES256, ecKey, claims(nil)), "--jwt-public-key", public)
	if want := "pushd: token refused: the signature does not match the public key --jwt-public-key " + public + " (from the command line)\n"; code != 1 || errOut != want {
		t.Errorf("verify against another public key: exit %d, stderr %q, want %q", code, errOut, want)
	}
}
