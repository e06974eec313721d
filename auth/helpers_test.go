package auth_test

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"sync"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/pushd/pushd/auth"
	"github.com/pushd/pushd/internal/testenv"
)

// TestMain drops the package's database (the session tests use one) and
// then checks for leaked goroutines.
func TestMain(m *testing.M) { testenv.Main(m) }

var testSecret = []byte("0123456789abcdef0123456789abcdef")

// keyPair is a generated signing key, its public key as PEM and the
// algorithm it pins.
type keyPair struct {
	alg    string
	method jwt.SigningMethod
	priv   crypto.Signer
	pem    []byte
}

// RSA key generation is slow under -race, so each kind is made once.
var (
	rsaKey = sync.OnceValue(func() keyPair {
		k, err := rsa.GenerateKey(rand.Reader, 2048)
		if err != nil {
			panic(err)
		}
		return keyPair{auth.AlgRS256, jwt.SigningMethodRS256, k, pkixPEM(k.Public())}
	})
	ecKey = sync.OnceValue(func() keyPair {
		k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			panic(err)
		}
		return keyPair{auth.AlgES256, jwt.SigningMethodES256, k, pkixPEM(k.Public())}
	})
	edKey = sync.OnceValue(func() keyPair {
		_, k, err := ed25519.GenerateKey(rand.Reader)
		if err != nil {
			panic(err)
		}
		return keyPair{auth.AlgEdDSA, jwt.SigningMethodEdDSA, k, pkixPEM(k.Public())}
	})
)

func publicKeyPairs() []keyPair { return []keyPair{rsaKey(), ecKey(), edKey()} }

func pkixPEM(pub crypto.PublicKey) []byte {
	der, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		panic(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der})
}

// goodClaims returns claims every verifier accepts.
func goodClaims() jwt.MapClaims {
	now := time.Now()
	return jwt.MapClaims{
		"sub":       "user_1",
		"tenant_id": "tenant-1",
		"exp":       now.Add(time.Hour).Unix(),
		"iat":       now.Unix(),
	}
}

// sign makes a token with any method and key, including ones a Verifier
// must refuse.
func sign(t testing.TB, method jwt.SigningMethod, key any, c jwt.Claims) string {
	t.Helper()
	s, err := jwt.NewWithClaims(method, c).SignedString(key)
	if err != nil {
		t.Fatalf("sign %s: %v", method.Alg(), err)
	}
	return s
}

func newVerifier(t testing.TB, cfg auth.Config) *auth.Verifier {
	t.Helper()
	v, err := auth.New(cfg)
	if err != nil {
		t.Fatalf("auth.New: %v", err)
	}
	return v
}

func hsVerifier(t testing.TB) *auth.Verifier {
	t.Helper()
	return newVerifier(t, auth.Config{Secret: testSecret})
}
