package main

import (
	"bufio"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/rsa"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/pushd/pushd/admission"
	"github.com/pushd/pushd/auth"
	"github.com/pushd/pushd/internal/flagval"
	"github.com/pushd/pushd/snapshot"
)

// defaultTokenTTL is the lifetime pushd token gives a token unless told
// otherwise (or --jwt-max-ttl is shorter).
const defaultTokenTTL = time.Hour

// tokenSettings are the node's settings pushd token and pushd token verify
// list in their usage; they accept every other flag of the node too, so one
// command line or config file serves both.
var tokenSettings = []string{"config", "jwt-secret", "jwt-secret-file", "jwt-public-key", "jwt-algorithm", "jwt-audience", "jwt-issuer", "jwt-max-ttl"}

// tokenClaims is the body of a token as the node reads it (auth's claims).
type tokenClaims struct {
	TenantID string   `json:"tenant_id"`
	Plan     string   `json:"plan,omitempty"`
	Projects []string `json:"projects,omitempty"`
	jwt.RegisteredClaims
}

// tokenFlagSet is the node's flag set renamed for a token command, with a
// usage that lists the command's own flags and the node's settings it
// reads.
func tokenFlagSet(c *config, name, synopsis string) *flag.FlagSet {
	fs := newFlagSet(c)
	fs.Init(name, flag.ContinueOnError)
	fs.Usage = func() {
		w := fs.Output()
		fmt.Fprintf(w, "Usage: %s\n\n", synopsis)
		node := newFlagSet(&config{})
		fs.VisitAll(func(f *flag.Flag) {
			if node.Lookup(f.Name) == nil {
				printFlag(w, f, "")
			}
		})
		fmt.Fprintf(w, "\nThe node's token settings, read as the node reads them (flag, PUSHD_* variable,\n--config file); every other flag of the node is accepted too:\n")
		for _, s := range tokenSettings {
			printFlag(w, fs.Lookup(s), envName(s))
		}
	}
	return fs
}

func printFlag(w io.Writer, f *flag.Flag, env string) {
	if env != "" {
		fmt.Fprintf(w, "  --%s (%s)\n    \t%s", f.Name, env, f.Usage)
	} else {
		fmt.Fprintf(w, "  --%s\n    \t%s", f.Name, f.Usage)
	}
	if f.DefValue != "" && f.DefValue != "0s" {
		fmt.Fprintf(w, " (default %q)", f.DefValue)
	}
	fmt.Fprintln(w)
}

// tokenCommand is pushd token: it mints a token for the node its settings
// configure, checks it with the node's own verifier, and prints it alone on
// stdout.
func tokenCommand(args, environ []string, stdin io.Reader, stdout, stderr io.Writer) error {
	if len(args) > 0 && args[0] == "verify" {
		return verifyCommand(args[1:], environ, stdin, stdout, stderr)
	}
	var (
		c                                        config
		tenant, user, plan, privateKey, projects string
		ttl                                      time.Duration
	)
	fs := tokenFlagSet(&c, "pushd token", "pushd token --tenant ID --user ID [--projects ID,ID|*] [--plan PLAN] [--ttl DURATION] [--private-key FILE] [node flags]\n       pushd token verify [TOKEN|-] [node flags]\n\nMints a token the node with the same settings accepts and prints it alone on stdout.")
	fs.StringVar(&tenant, "tenant", "", "tenant the token is for (claim tenant_id); required")
	fs.StringVar(&user, "user", "", "user the token is for (claim sub); required")
	fs.StringVar(&projects, "projects", "", "projects claim: the project ids (comma-separated) whose tasks the token sees besides its user's own, or * for every project of the tenant; empty: the user's own tasks only")
	fs.StringVar(&plan, "plan", "", "plan claim: free, pro or enterprise; empty leaves the tenant's configured plan")
	flagval.Duration(fs, &ttl, "ttl", "lifetime of the token; 0 means 1h, or --jwt-max-ttl when that is shorter")
	fs.StringVar(&privateKey, "private-key", "", "PEM file of the private key whose public key is --jwt-public-key (RS256, ES256, EdDSA); the node never needs it, so it is a flag only")
	if err := parseArgs(fs, args, stdout); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usageErrorf("unexpected argument %q (run pushd token -h for the flags)", fs.Arg(0))
	}
	if err := c.load(fs, newEnvironment(environ)); err != nil {
		return usageError{err}
	}
	warn(stderr, c.warnings)

	switch {
	case !snapshot.ValidID(tenant):
		return usageErrorf("--tenant %q: want an id of letters, digits and _ - . : (required)", tenant)
	case !snapshot.ValidID(user):
		return usageErrorf("--user %q: want an id of letters, digits and _ - . : (required)", user)
	case plan != "" && plan != admission.PlanFree && plan != admission.PlanPro && plan != admission.PlanEnterprise:
		return usageErrorf("--plan %q: want free, pro or enterprise", plan)
	case ttl < 0:
		return usageErrorf("--ttl %v: must be positive", ttl)
	}
	var grant *snapshot.Grant
	if projects != "" {
		var err error
		if grant, err = snapshot.ParseGrant(strings.Split(projects, ",")); err != nil {
			return usageErrorf("--projects %q: %v", projects, err)
		}
	}
	if ttl == 0 {
		ttl = defaultTokenTTL
		ttl = min(ttl, c.Node.JWTMaxTTL)
	}
	if ttl > c.Node.JWTMaxTTL {
		return usageErrorf("--ttl %v is longer than --jwt-max-ttl %v (from %s): the node would refuse the token", ttl, c.Node.JWTMaxTTL, c.from.of("jwt-max-ttl"))
	}

	method, key, err := c.signingKey(privateKey)
	if err != nil {
		return err
	}
	v, err := c.verifier()
	if err != nil {
		return err
	}
	now := time.Now()
	claims := tokenClaims{TenantID: tenant, Plan: plan, Projects: grant.Claim(), RegisteredClaims: jwt.RegisteredClaims{
		Subject: user, Issuer: c.Node.JWTIssuer,
		IssuedAt: jwt.NewNumericDate(now), ExpiresAt: jwt.NewNumericDate(now.Add(ttl)),
	}}
	if aud := c.jwtAudience(); len(aud) > 0 {
		claims.Audience = jwt.ClaimStrings{aud[0]}
	}
	tok, err := jwt.NewWithClaims(method, claims).SignedString(key)
	if err != nil {
		return fmt.Errorf("sign: %w", err)
	}
	if _, err := v.Verify(tok); err != nil {
		// Only a private key that is not the configured public key's gets here.
		return fmt.Errorf("the node would refuse the token: %s", c.explain(v, tok, err))
	}
	fmt.Fprintln(stdout, tok)
	return nil
}

// signingKey is the method and key pushd token signs with: the node's
// secret, or the private key of its public key.
func (c config) signingKey(privateKey string) (jwt.SigningMethod, any, error) {
	switch {
	case c.JWTSecret != "" && privateKey != "":
		return nil, nil, usageErrorf("--private-key signs RS256, ES256 or EdDSA tokens, but the node verifies HS256 with --jwt-secret (from %s)", c.from.of("jwt-secret"))
	case c.JWTSecret != "":
		return jwt.SigningMethodHS256, []byte(c.JWTSecret), nil
	case c.JWTPublicKey == "":
		return nil, nil, usageErrorf("no --jwt-secret or --jwt-public-key: pushd token mints tokens for a node configured with one (the embedded mode hands out demo tokens at /demo/token)")
	case privateKey == "":
		return nil, nil, usageErrorf("the node verifies tokens with --jwt-public-key %s (from %s); signing needs its private key: --private-key FILE", c.JWTPublicKey, c.from.of("jwt-public-key"))
	}
	b, err := os.ReadFile(privateKey)
	if err != nil {
		return nil, nil, usageErrorf("--private-key: %v", err)
	}
	k, err := parsePrivateKey(b)
	if err != nil {
		return nil, nil, usageErrorf("--private-key %s: %v", privateKey, err)
	}
	switch k := k.(type) {
	case *rsa.PrivateKey:
		return jwt.SigningMethodRS256, k, nil
	case *ecdsa.PrivateKey:
		return jwt.SigningMethodES256, k, nil
	case ed25519.PrivateKey:
		return jwt.SigningMethodEdDSA, k, nil
	}
	return nil, nil, usageErrorf("--private-key %s: unsupported key type %T", privateKey, k)
}

// parsePrivateKey reads the first PEM block: PKCS #8 "PRIVATE KEY", PKCS #1
// "RSA PRIVATE KEY" or SEC 1 "EC PRIVATE KEY", what openssl writes.
func parsePrivateKey(data []byte) (crypto.Signer, error) {
	block, _ := pem.Decode(data)
	if block == nil {
		return nil, errors.New("no PEM block found")
	}
	var (
		k   any
		err error
	)
	switch block.Type {
	case "PRIVATE KEY":
		k, err = x509.ParsePKCS8PrivateKey(block.Bytes)
	case "RSA PRIVATE KEY":
		k, err = x509.ParsePKCS1PrivateKey(block.Bytes)
	case "EC PRIVATE KEY":
		k, err = x509.ParseECPrivateKey(block.Bytes)
	default:
		return nil, fmt.Errorf("PEM block %q: want PRIVATE KEY, RSA PRIVATE KEY or EC PRIVATE KEY (unencrypted)", block.Type)
	}
	if err != nil {
		return nil, err
	}
	s, ok := k.(crypto.Signer)
	if !ok {
		return nil, fmt.Errorf("unsupported key type %T", k)
	}
	return s, nil
}

// verifier is the JWT verifier the node builds from c (node.New passes the
// same fields to auth.New); session tokens are the node's to look up.
func (c config) verifier() (*auth.Verifier, error) {
	if c.JWTSecret == "" && len(c.jwtPEM) == 0 {
		return nil, usageErrorf("no --jwt-secret or --jwt-public-key: the embedded mode verifies only its own demo tokens, with a secret made at start")
	}
	return auth.New(auth.Config{Secret: []byte(c.JWTSecret), PublicKeyPEM: c.jwtPEM, Algorithm: c.Node.JWTAlgorithm,
		Audience: c.jwtAudience(), Issuer: c.Node.JWTIssuer, MaxTTL: c.Node.JWTMaxTTL})
}

// verifyCommand is pushd token verify: it checks a token with the node's
// verifier and prints its claims, or explains the refusal and fails.
func verifyCommand(args, environ []string, stdin io.Reader, stdout, stderr io.Writer) error {
	var c config
	fs := tokenFlagSet(&c, "pushd token verify", "pushd token verify [TOKEN|-] [node flags]\n\nChecks TOKEN (or one read from stdin when it is - or absent) as the node with\nthe same settings would, and prints its claims as JSON; a refused token is\nexplained on stderr and exits 1.")
	if err := parseArgs(fs, args, stdout); err != nil {
		return err
	}
	tok := "-"
	if fs.NArg() > 0 {
		// Flags may follow the token too.
		tok = fs.Arg(0)
		if err := parseArgs(fs, fs.Args()[1:], stdout); err != nil {
			return err
		}
		if fs.NArg() > 0 {
			return usageErrorf("unexpected argument %q (run pushd token verify -h)", fs.Arg(0))
		}
	}
	if err := c.load(fs, newEnvironment(environ)); err != nil {
		return usageError{err}
	}
	warn(stderr, c.warnings)
	if tok == "-" {
		line, err := bufio.NewReader(io.LimitReader(stdin, auth.MaxTokenLen+2)).ReadString('\n')
		if err != nil && err != io.EOF {
			return fmt.Errorf("read the token from stdin: %w", err)
		}
		tok = strings.TrimSpace(line)
	}
	if tok == "" {
		return usageErrorf("no token: pass one, or - to read it from stdin")
	}
	if auth.IsSessionToken(tok) {
		return errors.New("token refused: not a JWT; a session token is looked up in Redis and PostgreSQL, which verify does not do")
	}
	v, err := c.verifier()
	if err != nil {
		return err
	}
	p, err := v.Verify(tok)
	if err != nil {
		return errors.New("token refused: " + c.explain(v, tok, err))
	}
	payload, err := tokenPayload(tok)
	if err != nil {
		return err
	}
	plan := p.Plan
	if plan == "" {
		plan = "(the tenant's configured plan)"
	}
	fmt.Fprintf(stderr, "pushd: token valid: tenant %s, user %s, %s, plan %s, %s, expires %s (in %v)\n",
		p.TenantID, p.UserID, grantText(p.Grant), plan, v.Algorithm(), p.ExpiresAt.UTC().Format(time.RFC3339), time.Until(p.ExpiresAt).Round(time.Second))
	fmt.Fprintf(stdout, "%s\n", payload)
	return nil
}

// grantText says what a token's grant lets it see inside its tenant.
func grantText(g *snapshot.Grant) string {
	switch {
	case g == nil:
		return "sees its own tasks only"
	case g.All:
		return "sees every project"
	}
	return "sees projects " + strings.Join(g.Projects, ",") + " and its own tasks"
}

// tokenPayload is the claims of a verified token as indented JSON.
func tokenPayload(tok string) ([]byte, error) {
	parts := strings.Split(tok, ".")
	raw, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		return nil, err
	}
	var m map[string]any
	if err := json.Unmarshal(raw, &m); err != nil {
		return nil, err
	}
	return json.MarshalIndent(m, "", "  ")
}

// explain says why v refused tok, in terms of the settings, from the
// reason auth gives and the token's unverified claims.
func (c config) explain(v *auth.Verifier, tok string, err error) string {
	reason, ok := auth.ReasonOf(err)
	if !ok {
		return err.Error()
	}
	var mc jwt.MapClaims
	t, _, perr := jwt.NewParser().ParseUnverified(tok, &mc)
	if perr != nil && reason != auth.ReasonTooLong {
		return "not a JWT (three base64url parts joined by dots, the middle one a JSON object)"
	}
	at := func(d *jwt.NumericDate) string { return d.UTC().Format(time.RFC3339) }
	exp, _ := mc.GetExpirationTime()
	iat, _ := mc.GetIssuedAt()
	switch reason {
	case auth.ReasonTooLong:
		return fmt.Sprintf("%d bytes, longer than the %d a token may have", len(tok), auth.MaxTokenLen)
	case auth.ReasonUnverifiable:
		return fmt.Sprintf("algorithm %v is none pushd verifies; this node takes %s", t.Header["alg"], v.Algorithm())
	case auth.ReasonAlgorithm:
		return fmt.Sprintf("signed with %v, but this node takes %s (%s)", t.Header["alg"], v.Algorithm(), c.keySetting())
	case auth.ReasonSignature:
		return fmt.Sprintf("the signature does not match %s", c.keySetting())
	case auth.ReasonExpired:
		return fmt.Sprintf("expired at %s, %v ago", at(exp), time.Since(exp.Time).Round(time.Second))
	case auth.ReasonNotYetValid:
		nbf, _ := mc.GetNotBefore()
		return fmt.Sprintf("not valid before %s (nbf)", at(nbf))
	case auth.ReasonIssuedLater:
		return fmt.Sprintf("issued at %s, in the future (iat)", at(iat))
	case auth.ReasonMissingClaim:
		var missing []string
		if exp == nil {
			missing = append(missing, "exp (every token needs an expiry)")
		}
		if _, ok := mc["aud"]; !ok && c.JWTAudience != "" {
			missing = append(missing, fmt.Sprintf("aud (--jwt-audience %s, from %s)", c.JWTAudience, c.from.of("jwt-audience")))
		}
		if _, ok := mc["iss"]; !ok && c.Node.JWTIssuer != "" {
			missing = append(missing, fmt.Sprintf("iss (--jwt-issuer %s, from %s)", c.Node.JWTIssuer, c.from.of("jwt-issuer")))
		}
		if len(missing) > 0 {
			return "missing claim " + strings.Join(missing, ", ")
		}
	case auth.ReasonAudience:
		aud, _ := mc.GetAudience()
		return fmt.Sprintf("aud %q names none of --jwt-audience %s (from %s)", []string(aud), c.JWTAudience, c.from.of("jwt-audience"))
	case auth.ReasonIssuer:
		iss, _ := mc.GetIssuer()
		return fmt.Sprintf("iss %q is not --jwt-issuer %s (from %s)", iss, c.Node.JWTIssuer, c.from.of("jwt-issuer"))
	case auth.ReasonLifetime:
		life, how := time.Until(exp.Time), "exp - now"
		if iat != nil {
			life, how = exp.Sub(iat.Time), "exp - iat"
		}
		return fmt.Sprintf("lifetime %v (%s) is longer than --jwt-max-ttl %v (from %s)", life.Round(time.Second), how, c.Node.JWTMaxTTL, c.from.of("jwt-max-ttl"))
	case auth.ReasonSubject:
		return badID(mc, "sub", "the user")
	case auth.ReasonTenant:
		return badID(mc, "tenant_id", "the tenant")
	case auth.ReasonProjects:
		return fmt.Sprintf("projects %#v: want up to %d project ids, or [\"*\"] alone for every project", mc["projects"], snapshot.MaxGrantProjects)
	}
	return string(reason)
}

// badID says what is wrong with the id claim name.
func badID(mc jwt.MapClaims, name, what string) string {
	v, ok := mc[name]
	if !ok {
		return fmt.Sprintf("missing claim %s (%s)", name, what)
	}
	return fmt.Sprintf("%s %#v (%s) is not an id of letters, digits and _ - . :", name, v, what)
}

// keySetting names the key the node verifies with and where it came from.
func (c config) keySetting() string {
	if c.JWTSecret != "" {
		return fmt.Sprintf("the secret --jwt-secret (from %s)", c.from.of("jwt-secret"))
	}
	return fmt.Sprintf("the public key --jwt-public-key %s (from %s)", c.JWTPublicKey, c.from.of("jwt-public-key"))
}

// warn prints warnings for a command that has no logger.
func warn(w io.Writer, warnings []warning) {
	for _, x := range warnings {
		fmt.Fprintln(w, "pushd: warning:", x)
	}
}
