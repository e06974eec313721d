package auth

import (
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/pushd/pushd/snapshot"
)

// minRSABits is the smallest RSA modulus New accepts.
const minRSABits = 2048

// Config says how a Verifier checks tokens. Exactly one of Secret and
// PublicKeyPEM must be set.
type Config struct {
	// Secret is the HS256 shared secret. Empty means tokens are signed with
	// a public-key algorithm and PublicKeyPEM is set instead.
	Secret []byte
	// PublicKeyPEM is a PEM-encoded public key: "PUBLIC KEY" (PKIX),
	// "RSA PUBLIC KEY" (PKCS1) or a "CERTIFICATE" whose key is used. The
	// key type pins the algorithm: RSA (2048 bits or more) means RS256,
	// ECDSA P-256 means ES256, Ed25519 means EdDSA. Empty means Secret is set.
	PublicKeyPEM []byte
	// Algorithm optionally pins the algorithm explicitly: AlgHS256,
	// AlgRS256, AlgES256 or AlgEdDSA. It must agree with the key. Empty
	// means the algorithm the key implies.
	Algorithm string
	// CookieName is the cookie Authenticate reads a token from. Empty means
	// DefaultCookieName.
	CookieName string
	// Leeway is the clock skew allowed when checking exp, nbf and iat. Zero
	// means 5s; a negative leeway is an error.
	Leeway time.Duration
	// Audience, when set, are the audiences a JWT may be for: its aud claim
	// must name at least one of them. Empty checks no audience.
	Audience []string
	// Issuer, when set, is the iss claim every JWT must carry. Empty checks
	// no issuer.
	Issuer string
	// MaxTTL is the longest lifetime a JWT may claim: exp - iat, or, for a
	// token without iat, exp - now less the leeway. A token past it is
	// refused however it is signed, so a leaked long-lived one cannot be
	// used here. Zero means DefaultMaxTTL; negative is an error.
	MaxTTL time.Duration
	// Sessions, when set, resolves opaque session tokens (any token that is
	// not a JWT, see IsSessionToken); nil means only JWTs are accepted.
	Sessions SessionResolver
}

// DefaultMaxTTL is Config.MaxTTL's default: a day covers an auth service's
// usual tokens (minutes to hours) and refuses one minted for years.
const DefaultMaxTTL = 24 * time.Hour

// Verifier checks tokens. It is safe for concurrent use.
type Verifier struct {
	alg        string
	key        any // []byte, *rsa.PublicKey, *ecdsa.PublicKey or ed25519.PublicKey
	cookieName string
	parser     *jwt.Parser
	leeway     time.Duration
	maxTTL     time.Duration
	sessions   SessionResolver
}

// New returns a Verifier for cfg. It fails when no key or both keys are
// set, when the PEM or the key in it cannot be used, and when
// cfg.Algorithm disagrees with the key.
func New(cfg Config) (*Verifier, error) {
	if cfg.Leeway < 0 {
		return nil, errors.New("auth: negative leeway")
	}
	if cfg.MaxTTL < 0 {
		return nil, errors.New("auth: negative maximum token lifetime")
	}
	if cfg.MaxTTL == 0 {
		cfg.MaxTTL = DefaultMaxTTL
	}
	if slices.Contains(cfg.Audience, "") {
		return nil, errors.New("auth: empty audience")
	}
	if cfg.Leeway == 0 {
		cfg.Leeway = defaultLeeway
	}
	if cfg.CookieName == "" {
		cfg.CookieName = DefaultCookieName
	}

	var (
		alg string
		key any
	)
	switch {
	case len(cfg.Secret) > 0 && len(cfg.PublicKeyPEM) > 0:
		return nil, errors.New("auth: both a secret and a public key are set; set one")
	case len(cfg.Secret) > 0:
		alg, key = AlgHS256, slices.Clone(cfg.Secret)
	case len(cfg.PublicKeyPEM) > 0:
		var err error
		if alg, key, err = parsePublicKey(cfg.PublicKeyPEM); err != nil {
			return nil, err
		}
	default:
		return nil, errors.New("auth: no secret or public key is set")
	}

	if cfg.Algorithm != "" && cfg.Algorithm != alg {
		switch cfg.Algorithm {
		case AlgHS256, AlgRS256, AlgES256, AlgEdDSA:
			return nil, fmt.Errorf("auth: algorithm %s does not match the configured key (%s)", cfg.Algorithm, alg)
		default:
			return nil, fmt.Errorf("auth: unsupported algorithm %q", cfg.Algorithm)
		}
	}

	opts := []jwt.ParserOption{
		jwt.WithValidMethods([]string{alg}),
		jwt.WithExpirationRequired(),
		jwt.WithIssuedAt(),
		jwt.WithLeeway(cfg.Leeway),
	}
	if len(cfg.Audience) > 0 {
		opts = append(opts, jwt.WithAudience(cfg.Audience...))
	}
	if cfg.Issuer != "" {
		opts = append(opts, jwt.WithIssuer(cfg.Issuer))
	}
	return &Verifier{
		alg:        alg,
		key:        key,
		cookieName: cfg.CookieName,
		sessions:   cfg.Sessions,
		leeway:     cfg.Leeway,
		maxTTL:     cfg.MaxTTL,
		parser:     jwt.NewParser(opts...),
	}, nil
}

// parsePublicKey reads the first PEM block of data and returns the
// algorithm its key pins and the key.
func parsePublicKey(data []byte) (string, any, error) {
	block, _ := pem.Decode(data)
	if block == nil {
		return "", nil, errors.New("auth: public key: no PEM block found")
	}
	var (
		pub any
		err error
	)
	switch block.Type {
	case "PUBLIC KEY":
		pub, err = x509.ParsePKIXPublicKey(block.Bytes)
	case "RSA PUBLIC KEY":
		pub, err = x509.ParsePKCS1PublicKey(block.Bytes)
	case "CERTIFICATE":
		var cert *x509.Certificate
		if cert, err = x509.ParseCertificate(block.Bytes); err == nil {
			pub = cert.PublicKey
		}
	default:
		return "", nil, fmt.Errorf("auth: public key: unsupported PEM block %q (want PUBLIC KEY, RSA PUBLIC KEY or CERTIFICATE)", block.Type)
	}
	if err != nil {
		return "", nil, fmt.Errorf("auth: public key: %w", err)
	}

	switch k := pub.(type) {
	case *rsa.PublicKey:
		if k.N.BitLen() < minRSABits {
			return "", nil, fmt.Errorf("auth: public key: RSA key of %d bits, want at least %d", k.N.BitLen(), minRSABits)
		}
		return AlgRS256, k, nil
	case *ecdsa.PublicKey:
		if k.Curve != elliptic.P256() {
			return "", nil, fmt.Errorf("auth: public key: ECDSA curve %s, want P-256", k.Curve.Params().Name)
		}
		return AlgES256, k, nil
	case ed25519.PublicKey:
		return AlgEdDSA, k, nil
	default:
		return "", nil, fmt.Errorf("auth: public key: unsupported key type %T", pub)
	}
}

// Verify checks token and returns the principal it names. The error wraps
// ErrMissingToken for an empty token, ErrTokenExpired for a correctly signed
// token past its expiry, and ErrInvalidToken for anything else.
func (v *Verifier) Verify(token string) (Principal, error) {
	if token == "" {
		return Principal{}, ErrMissingToken
	}
	if len(token) > MaxTokenLen {
		return Principal{}, Invalid(ReasonTooLong, nil)
	}

	var c claims
	if t, err := v.parser.ParseWithClaims(token, &c, v.keyFor); err != nil {
		if errors.Is(err, jwt.ErrTokenSignatureInvalid) && t != nil && t.Method != nil && t.Method.Alg() != v.alg {
			return Principal{}, Invalid(ReasonAlgorithm, err)
		}
		return Principal{}, classify(err)
	}
	// The parser already required exp; a nil here would be a library bug.
	if c.ExpiresAt == nil {
		return Principal{}, Invalid(ReasonMissingClaim, nil)
	}
	if v.maxTTL > 0 {
		life := time.Until(c.ExpiresAt.Time) - v.leeway
		if c.IssuedAt != nil {
			life = c.ExpiresAt.Sub(c.IssuedAt.Time)
		}
		if life > v.maxTTL {
			return Principal{}, Invalid(ReasonLifetime, nil)
		}
	}
	if !snapshot.ValidID(c.Subject) {
		return Principal{}, Invalid(ReasonSubject, nil)
	}
	if !snapshot.ValidID(c.TenantID) {
		return Principal{}, Invalid(ReasonTenant, nil)
	}
	grant, err := snapshot.ParseGrant(c.Projects)
	if err != nil {
		return Principal{}, Invalid(ReasonProjects, err)
	}
	p := Principal{TenantID: c.TenantID, UserID: c.Subject, ExpiresAt: c.ExpiresAt.Time, EndsAt: c.ExpiresAt.Time.Add(v.leeway), Grant: grant}
	// A plan claim only selects limits; one that is not a plain name is
	// ignored rather than refusing an otherwise good token.
	if snapshot.ValidID(c.Plan) {
		p.Plan = c.Plan
	}
	return p, nil
}

// keyFor returns the verification key. The parser has already refused any
// algorithm but v.alg; the check here keeps that true should the parser
// options ever change.
func (v *Verifier) keyFor(t *jwt.Token) (any, error) {
	if t.Method.Alg() != v.alg {
		return nil, errors.New("unexpected signing method")
	}
	return v.key, nil
}

// classify maps a parser error to ErrTokenExpired or ErrInvalidToken. The
// message is chosen here rather than taken from the library, whose messages
// may quote attacker-controlled header values.
func classify(err error) error {
	switch {
	case errors.Is(err, jwt.ErrTokenMalformed):
		return Invalid(ReasonMalformed, err)
	case errors.Is(err, jwt.ErrTokenSignatureInvalid):
		return Invalid(ReasonSignature, err)
	case errors.Is(err, jwt.ErrTokenUnverifiable):
		return Invalid(ReasonUnverifiable, err)
	case errors.Is(err, jwt.ErrTokenRequiredClaimMissing):
		return Invalid(ReasonMissingClaim, err)
	case errors.Is(err, jwt.ErrTokenInvalidAudience):
		return Invalid(ReasonAudience, err)
	case errors.Is(err, jwt.ErrTokenInvalidIssuer):
		return Invalid(ReasonIssuer, err)
	case errors.Is(err, jwt.ErrTokenExpired):
		// Only reached with a good signature: the parser checks it first.
		return &tokenError{sentinel: ErrTokenExpired, reason: ReasonExpired, cause: err}
	case errors.Is(err, jwt.ErrTokenNotValidYet):
		return Invalid(ReasonNotYetValid, err)
	case errors.Is(err, jwt.ErrTokenUsedBeforeIssued):
		return Invalid(ReasonIssuedLater, err)
	default:
		return Invalid(ReasonClaims, err)
	}
}

// tokenError carries one of the exported sentinels, a fixed reason and the
// library's error, reachable through errors.Is and errors.As but never
// printed.
type tokenError struct {
	sentinel error
	reason   Reason
	cause    error
}

// Invalid is the error of a refused token: it wraps ErrInvalidToken and
// carries reason. A SessionResolver returns it for an unknown, expired or
// malformed session, so callers branch on sessions as on JWTs.
func Invalid(reason Reason, cause error) error {
	return &tokenError{sentinel: ErrInvalidToken, reason: reason, cause: cause}
}

func (e *tokenError) Error() string {
	if e.sentinel == ErrTokenExpired {
		return e.sentinel.Error()
	}
	return e.sentinel.Error() + ": " + string(e.reason)
}

func (e *tokenError) Unwrap() []error {
	if e.cause == nil {
		return []error{e.sentinel}
	}
	return []error{e.sentinel, e.cause}
}

// Reason is why Verify refused a token. The server logs only the error; a
// tool that explains a refusal (pushd token verify) branches on the reason.
type Reason string

// The reasons Verify's errors carry; ReasonOf returns them.
const (
	ReasonTooLong      Reason = "token longer than the limit"
	ReasonMalformed    Reason = "malformed"
	ReasonUnverifiable Reason = "unverifiable" // an algorithm no verifier knows, such as none
	ReasonAlgorithm    Reason = "signed with another algorithm"
	ReasonSignature    Reason = "bad signature"
	ReasonMissingClaim Reason = "missing required claim (exp, or the configured aud or iss)"
	ReasonAudience     Reason = "not for this audience"
	ReasonIssuer       Reason = "from another issuer"
	ReasonExpired      Reason = "expired"
	ReasonNotYetValid  Reason = "not valid yet"
	ReasonIssuedLater  Reason = "issued in the future"
	ReasonClaims       Reason = "bad claims"
	ReasonLifetime     Reason = "lifetime longer than the limit"
	ReasonSubject      Reason = "missing or invalid sub claim"
	ReasonTenant       Reason = "missing or invalid tenant_id claim"
	ReasonProjects     Reason = "invalid projects claim"
)

// ReasonOf returns the reason of an error Verify returned, and false for
// any other error (ErrMissingToken among them).
func ReasonOf(err error) (Reason, bool) {
	var te *tokenError
	if errors.As(err, &te) {
		return te.reason, true
	}
	return "", false
}
