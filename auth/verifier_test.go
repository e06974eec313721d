package auth_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/base64"
	"encoding/pem"
	"errors"
	"math/big"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/pushd/pushd/auth"
)

// wantErr checks that err wraps want, that ErrInvalidToken and
// ErrTokenExpired are never both matched, and that the message does not
// repeat the token or any of its parts.
func wantErr(t *testing.T, token string, err, want error) {
	t.Helper()
	if !errors.Is(err, want) {
		t.Fatalf("err = %v, want %v", err, want)
	}
	if errors.Is(err, auth.ErrInvalidToken) && errors.Is(err, auth.ErrTokenExpired) {
		t.Errorf("err %v matches both ErrInvalidToken and ErrTokenExpired", err)
	}
	msg := err.Error()
	for part := range strings.SplitSeq(token, ".") {
		if len(part) >= 4 && strings.Contains(msg, part) {
			t.Errorf("error message %q repeats part of the token", msg)
		}
	}
}

func TestVerifyHS256(t *testing.T) {
	v := hsVerifier(t)
	exp := time.Now().Add(time.Hour).Truncate(time.Second)
	c := goodClaims()
	c["exp"] = exp.Unix()
	c["extra"] = map[string]any{"plan": "pro"} // unknown claims are ignored

	p, err := v.Verify(sign(t, jwt.SigningMethodHS256, testSecret, c))
	if err != nil {
		t.Fatalf("Verify: %v", err)
	}
	want := auth.Principal{TenantID: "tenant-1", UserID: "user_1", ExpiresAt: exp}
	if p.TenantID != want.TenantID || p.UserID != want.UserID || !p.ExpiresAt.Equal(want.ExpiresAt) {
		t.Errorf("Verify = %+v, want %+v", p, want)
	}
}

func TestVerifyPublicKeys(t *testing.T) {
	for _, kp := range publicKeyPairs() {
		t.Run(kp.alg, func(t *testing.T) {
			token := sign(t, kp.method, kp.priv, goodClaims())

			// The key pins the algorithm; pinning it explicitly is the same.
			for _, alg := range []string{"", kp.alg} {
				v := newVerifier(t, auth.Config{PublicKeyPEM: kp.pem, Algorithm: alg})
				p, err := v.Verify(token)
				if err != nil {
					t.Fatalf("Verify (Algorithm %q): %v", alg, err)
				}
				if p.TenantID != "tenant-1" || p.UserID != "user_1" {
					t.Errorf("Verify = %+v", p)
				}
			}
		})
	}
}

func TestVerifyOtherKeyOfSameType(t *testing.T) {
	other, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	v := newVerifier(t, auth.Config{PublicKeyPEM: ecKey().pem})
	token := sign(t, jwt.SigningMethodES256, other, goodClaims())
	_, err = v.Verify(token)
	wantErr(t, token, err, auth.ErrInvalidToken)
}

func TestVerifyAlgNone(t *testing.T) {
	none := sign(t, jwt.SigningMethodNone, jwt.UnsafeAllowNoneSignatureType, goodClaims())
	// The same, built by hand with a stray signature, and with "NONE".
	handmade := func(alg, sig string) string {
		enc := base64.RawURLEncoding.EncodeToString
		return enc([]byte(`{"alg":"`+alg+`","typ":"JWT"}`)) + "." +
			enc([]byte(`{"sub":"user_1","tenant_id":"tenant-1","exp":9999999999}`)) + "." + sig
	}
	tokens := []string{none, handmade("none", ""), handmade("none", "c2ln"), handmade("NONE", ""), handmade("", "")}

	verifiers := map[string]*auth.Verifier{"HS256": hsVerifier(t)}
	for _, kp := range publicKeyPairs() {
		verifiers[kp.alg] = newVerifier(t, auth.Config{PublicKeyPEM: kp.pem})
	}
	for name, v := range verifiers {
		for _, token := range tokens {
			_, err := v.Verify(token)
			if err == nil {
				t.Fatalf("%s verifier accepted unsigned token %q", name, token)
			}
			wantErr(t, token, err, auth.ErrInvalidToken)
		}
	}
}

func TestVerifyWrongSignature(t *testing.T) {
	v := hsVerifier(t)

	t.Run("other secret", func(t *testing.T) {
		token := sign(t, jwt.SigningMethodHS256, []byte("another secret of enough length!"), goodClaims())
		_, err := v.Verify(token)
		wantErr(t, token, err, auth.ErrInvalidToken)
	})

	t.Run("tampered claims", func(t *testing.T) {
		good := sign(t, jwt.SigningMethodHS256, testSecret, goodClaims())
		evil := goodClaims()
		evil["tenant_id"] = "tenant-2"
		forged := sign(t, jwt.SigningMethodHS256, []byte("x"), evil)
		parts, forgedParts := strings.Split(good, "."), strings.Split(forged, ".")
		token := parts[0] + "." + forgedParts[1] + "." + parts[2]
		_, err := v.Verify(token)
		wantErr(t, token, err, auth.ErrInvalidToken)
	})

	t.Run("truncated signature", func(t *testing.T) {
		good := sign(t, jwt.SigningMethodHS256, testSecret, goodClaims())
		token := good[:len(good)-4]
		_, err := v.Verify(token)
		wantErr(t, token, err, auth.ErrInvalidToken)
	})
}

// A verifier accepts exactly its pinned algorithm, even from a token the
// same key material could verify under another one.
func TestVerifyWrongAlgorithmForPinnedKey(t *testing.T) {
	rk, ek, dk := rsaKey(), ecKey(), edKey()
	cases := []struct {
		name   string
		cfg    auth.Config
		method jwt.SigningMethod
		key    any
	}{
		{"HS256 verifier, HS512 token, same secret", auth.Config{Secret: testSecret}, jwt.SigningMethodHS512, testSecret},
		{"HS256 verifier, HS384 token, same secret", auth.Config{Secret: testSecret}, jwt.SigningMethodHS384, testSecret},
		{"HS256 verifier, RS256 token", auth.Config{Secret: testSecret}, jwt.SigningMethodRS256, rk.priv},
		{"RS256 verifier, PS256 token, same key", auth.Config{PublicKeyPEM: rk.pem}, jwt.SigningMethodPS256, rk.priv},
		{"RS256 verifier, RS512 token, same key", auth.Config{PublicKeyPEM: rk.pem}, jwt.SigningMethodRS512, rk.priv},
		{"RS256 verifier, ES256 token", auth.Config{PublicKeyPEM: rk.pem}, jwt.SigningMethodES256, ek.priv},
		{"ES256 verifier, EdDSA token", auth.Config{PublicKeyPEM: ek.pem}, jwt.SigningMethodEdDSA, dk.priv},
		{"EdDSA verifier, RS256 token", auth.Config{PublicKeyPEM: dk.pem}, jwt.SigningMethodRS256, rk.priv},
		{"EdDSA verifier, HS256 token", auth.Config{PublicKeyPEM: dk.pem}, jwt.SigningMethodHS256, testSecret},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			v := newVerifier(t, tc.cfg)
			token := sign(t, tc.method, tc.key, goodClaims())
			_, err := v.Verify(token)
			wantErr(t, token, err, auth.ErrInvalidToken)
		})
	}
}

// The classic confusion attack: the public key is public, so an attacker
// signs an HS256 token with its bytes as the HMAC secret and hopes the
// verifier feeds the same bytes to HMAC.
func TestVerifyAlgorithmConfusion(t *testing.T) {
	for _, kp := range publicKeyPairs() {
		t.Run(kp.alg, func(t *testing.T) {
			v := newVerifier(t, auth.Config{PublicKeyPEM: kp.pem})
			der, _ := pem.Decode(kp.pem)
			for _, secret := range [][]byte{kp.pem, der.Bytes} {
				token := sign(t, jwt.SigningMethodHS256, secret, goodClaims())
				_, err := v.Verify(token)
				wantErr(t, token, err, auth.ErrInvalidToken)
			}
		})
	}
}

func TestVerifyExpiry(t *testing.T) {
	now := time.Now()
	withExp := func(exp time.Time) jwt.MapClaims {
		c := goodClaims()
		c["exp"] = exp.Unix()
		c["iat"] = exp.Add(-time.Hour).Unix()
		return c
	}

	t.Run("expired", func(t *testing.T) {
		token := sign(t, jwt.SigningMethodHS256, testSecret, withExp(now.Add(-time.Minute)))
		_, err := hsVerifier(t).Verify(token)
		wantErr(t, token, err, auth.ErrTokenExpired)
		if errors.Is(err, auth.ErrInvalidToken) {
			t.Errorf("expired token also matches ErrInvalidToken: %v", err)
		}
	})

	t.Run("expired with a bad signature is invalid, not expired", func(t *testing.T) {
		token := sign(t, jwt.SigningMethodHS256, []byte("wrong"), withExp(now.Add(-time.Minute)))
		_, err := hsVerifier(t).Verify(token)
		wantErr(t, token, err, auth.ErrInvalidToken)
	})

	t.Run("within default leeway", func(t *testing.T) {
		// exp is truncated to the second, so this is 2 to 3s ago: inside 5s.
		token := sign(t, jwt.SigningMethodHS256, testSecret, withExp(now.Add(-2*time.Second)))
		if _, err := hsVerifier(t).Verify(token); err != nil {
			t.Fatalf("Verify: %v", err)
		}
	})

	t.Run("within configured leeway", func(t *testing.T) {
		token := sign(t, jwt.SigningMethodHS256, testSecret, withExp(now.Add(-30*time.Second)))
		if _, err := hsVerifier(t).Verify(token); !errors.Is(err, auth.ErrTokenExpired) {
			t.Fatalf("default leeway: err = %v, want ErrTokenExpired", err)
		}
		v := newVerifier(t, auth.Config{Secret: testSecret, Leeway: time.Minute})
		if _, err := v.Verify(token); err != nil {
			t.Fatalf("Leeway 1m: %v", err)
		}
	})

	t.Run("missing exp", func(t *testing.T) {
		c := goodClaims()
		delete(c, "exp")
		token := sign(t, jwt.SigningMethodHS256, testSecret, c)
		_, err := hsVerifier(t).Verify(token)
		wantErr(t, token, err, auth.ErrInvalidToken)
	})

	t.Run("exp not a number", func(t *testing.T) {
		c := goodClaims()
		c["exp"] = "tomorrow"
		token := sign(t, jwt.SigningMethodHS256, testSecret, c)
		_, err := hsVerifier(t).Verify(token)
		wantErr(t, token, err, auth.ErrInvalidToken)
	})

	t.Run("not valid yet", func(t *testing.T) {
		c := goodClaims()
		c["nbf"] = now.Add(time.Minute).Unix()
		token := sign(t, jwt.SigningMethodHS256, testSecret, c)
		_, err := hsVerifier(t).Verify(token)
		wantErr(t, token, err, auth.ErrInvalidToken)
	})

	t.Run("issued in the future", func(t *testing.T) {
		c := goodClaims()
		c["iat"] = now.Add(time.Minute).Unix()
		token := sign(t, jwt.SigningMethodHS256, testSecret, c)
		_, err := hsVerifier(t).Verify(token)
		wantErr(t, token, err, auth.ErrInvalidToken)
	})
}

func TestVerifyIdentityClaims(t *testing.T) {
	v := hsVerifier(t)
	bad := []any{nil, "", "a b", "t{1}", "tenant/1", "tenant\n1", "ténant", strings.Repeat("a", 129), 42, []string{"t1"}}
	for _, claim := range []string{"sub", "tenant_id"} {
		for _, val := range bad {
			c := goodClaims()
			if val == nil {
				delete(c, claim)
			} else {
				c[claim] = val
			}
			token := sign(t, jwt.SigningMethodHS256, testSecret, c)
			_, err := v.Verify(token)
			if err == nil {
				t.Fatalf("%s = %#v accepted", claim, val)
			}
			wantErr(t, token, err, auth.ErrInvalidToken)
		}
	}

	// The longest valid id is fine.
	c := goodClaims()
	c["tenant_id"] = strings.Repeat("a", 128)
	c["sub"] = "A-z_0.9:x"
	if _, err := v.Verify(sign(t, jwt.SigningMethodHS256, testSecret, c)); err != nil {
		t.Fatalf("Verify with 128-byte tenant id: %v", err)
	}
}

func TestVerifyMalformed(t *testing.T) {
	v := hsVerifier(t)
	good := sign(t, jwt.SigningMethodHS256, testSecret, goodClaims())
	for _, token := range []string{
		"x", "a.b", "a.b.c.d", "...", "!!!!.!!!!.!!!!", good + ".", good + "x==",
		"eyJhbGciOiJIUzI1NiJ9.bm90IGpzb24.c2ln", // claims are not JSON
		base64.RawURLEncoding.EncodeToString([]byte(`{"alg":"HS256\nEVILHEADER"}`)) + ".e30.c2ln",
	} {
		_, err := v.Verify(token)
		wantErr(t, token, err, auth.ErrInvalidToken)
		if strings.Contains(err.Error(), "EVILHEADER") {
			t.Errorf("error message %q repeats a header value", err)
		}
	}

	if _, err := v.Verify(""); !errors.Is(err, auth.ErrMissingToken) {
		t.Errorf("Verify(\"\") = %v, want ErrMissingToken", err)
	}
}

func TestVerifyTokenLength(t *testing.T) {
	v := hsVerifier(t)
	padded := func(n int) string {
		c := goodClaims()
		c["pad"] = strings.Repeat("p", n)
		return sign(t, jwt.SigningMethodHS256, testSecret, c)
	}

	// Grow a correctly signed token until it passes the limit.
	base := len(padded(0))
	under := padded((auth.MaxTokenLen-base)*3/4 - 3)
	if len(under) > auth.MaxTokenLen {
		t.Fatalf("test bug: token of %d bytes", len(under))
	}
	if _, err := v.Verify(under); err != nil {
		t.Fatalf("Verify of a %d-byte token: %v", len(under), err)
	}
	over := padded(auth.MaxTokenLen)
	_, err := v.Verify(over)
	wantErr(t, over, err, auth.ErrInvalidToken)

	huge := strings.Repeat("A", 1<<20)
	_, err = v.Verify(huge)
	wantErr(t, huge, err, auth.ErrInvalidToken)
}

func TestVerifierKeepsItsOwnSecret(t *testing.T) {
	secret := []byte(string(testSecret))
	v := newVerifier(t, auth.Config{Secret: secret})
	token := sign(t, jwt.SigningMethodHS256, testSecret, goodClaims())
	for i := range secret {
		secret[i] = 0
	}
	if _, err := v.Verify(token); err != nil {
		t.Fatalf("Verify after the caller reused its secret slice: %v", err)
	}
}

func TestVerifyConcurrent(t *testing.T) {
	v := hsVerifier(t)
	good := sign(t, jwt.SigningMethodHS256, testSecret, goodClaims())
	bad := sign(t, jwt.SigningMethodHS256, []byte("wrong"), goodClaims())
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 50 {
				if _, err := v.Verify(good); err != nil {
					t.Errorf("Verify good: %v", err)
					return
				}
				if _, err := v.Verify(bad); !errors.Is(err, auth.ErrInvalidToken) {
					t.Errorf("Verify bad: %v", err)
					return
				}
			}
		})
	}
	wg.Wait()
}

func TestNew(t *testing.T) {
	rk, ek, dk := rsaKey(), ecKey(), edKey()

	p384, err := ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	// A 1024-bit modulus, built without generating a weak key.
	smallRSA := &rsa.PublicKey{N: new(big.Int).Lsh(big.NewInt(1), 1023), E: 65537}
	smallRSA.N.Or(smallRSA.N, big.NewInt(1))
	privDER, err := x509.MarshalPKCS8PrivateKey(ek.priv)
	if err != nil {
		t.Fatal(err)
	}
	privPEM := pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: privDER})
	pkcs1 := pem.EncodeToMemory(&pem.Block{Type: "RSA PUBLIC KEY", Bytes: x509.MarshalPKCS1PublicKey(rk.priv.Public().(*rsa.PublicKey))})

	bad := []struct {
		name string
		cfg  auth.Config
	}{
		{"no key", auth.Config{}},
		{"no key, algorithm only", auth.Config{Algorithm: auth.AlgHS256}},
		{"both keys", auth.Config{Secret: testSecret, PublicKeyPEM: rk.pem}},
		{"not PEM", auth.Config{PublicKeyPEM: []byte("not a pem file")}},
		{"corrupt PEM body", auth.Config{PublicKeyPEM: pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: []byte("junk")})}},
		{"private key", auth.Config{PublicKeyPEM: privPEM}},
		{"ECDSA P-384", auth.Config{PublicKeyPEM: pkixPEM(p384.Public())}},
		{"RSA 1024", auth.Config{PublicKeyPEM: pkixPEM(smallRSA)}},
		{"secret with RS256", auth.Config{Secret: testSecret, Algorithm: auth.AlgRS256}},
		{"RSA key with ES256", auth.Config{PublicKeyPEM: rk.pem, Algorithm: auth.AlgES256}},
		{"RSA key with HS256", auth.Config{PublicKeyPEM: rk.pem, Algorithm: auth.AlgHS256}},
		{"ECDSA key with EdDSA", auth.Config{PublicKeyPEM: ek.pem, Algorithm: auth.AlgEdDSA}},
		{"Ed25519 key with RS256", auth.Config{PublicKeyPEM: dk.pem, Algorithm: auth.AlgRS256}},
		{"unsupported algorithm", auth.Config{Secret: testSecret, Algorithm: "HS512"}},
		{"algorithm none", auth.Config{Secret: testSecret, Algorithm: "none"}},
		{"negative leeway", auth.Config{Secret: testSecret, Leeway: -time.Second}},
		{"negative maximum lifetime", auth.Config{Secret: testSecret, MaxTTL: -time.Second}},
		{"empty audience", auth.Config{Secret: testSecret, Audience: []string{"pushd", ""}}},
	}
	for _, tc := range bad {
		t.Run(tc.name, func(t *testing.T) {
			v, err := auth.New(tc.cfg)
			if err == nil {
				t.Fatalf("New succeeded: %v", v)
			}
			if len(tc.cfg.Secret) > 0 && strings.Contains(err.Error(), string(tc.cfg.Secret)) {
				t.Errorf("error %q repeats the secret", err)
			}
		})
	}

	t.Run("PKCS1 RSA public key", func(t *testing.T) {
		v := newVerifier(t, auth.Config{PublicKeyPEM: pkcs1})
		if _, err := v.Verify(sign(t, jwt.SigningMethodRS256, rk.priv, goodClaims())); err != nil {
			t.Fatalf("Verify: %v", err)
		}
	})

	t.Run("certificate", func(t *testing.T) {
		tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), NotBefore: time.Now(), NotAfter: time.Now().Add(time.Hour)}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, ek.priv.Public(), ek.priv)
		if err != nil {
			t.Fatal(err)
		}
		v := newVerifier(t, auth.Config{PublicKeyPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})})
		if _, err := v.Verify(sign(t, jwt.SigningMethodES256, ek.priv, goodClaims())); err != nil {
			t.Fatalf("Verify: %v", err)
		}
	})
}
