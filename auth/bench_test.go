package auth_test

import (
	"testing"

	"github.com/golang-jwt/jwt/v5"

	"github.com/pushd/pushd/auth"
)

// Verify runs once per connection and per HTTP request.
func BenchmarkVerifyHS256(b *testing.B) {
	v := hsVerifier(b)
	token := sign(b, jwt.SigningMethodHS256, testSecret, goodClaims())
	b.ReportAllocs()
	for b.Loop() {
		if _, err := v.Verify(token); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkVerifyPublicKey(b *testing.B) {
	for _, kp := range publicKeyPairs() {
		b.Run(kp.alg, func(b *testing.B) {
			v := newVerifier(b, auth.Config{PublicKeyPEM: kp.pem})
			token := sign(b, kp.method, kp.priv, goodClaims())
			b.ReportAllocs()
			for b.Loop() {
				if _, err := v.Verify(token); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// A refused token should cost no more than an accepted one.
func BenchmarkVerifyHS256BadSignature(b *testing.B) {
	v := hsVerifier(b)
	token := sign(b, jwt.SigningMethodHS256, []byte("wrong"), goodClaims())
	b.ReportAllocs()
	for b.Loop() {
		if _, err := v.Verify(token); err == nil {
			b.Fatal("accepted")
		}
	}
}
