package auth_test

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"net/url"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/pushd/pushd/auth"
)

func TestTokenFromRequest(t *testing.T) {
	type req struct {
		header string // Authorization
		cookie *http.Cookie
		query  string
	}
	cases := []struct {
		name   string
		r      req
		cookie string // cookieName argument
		want   string
	}{
		{"none", req{}, "", ""},
		{"header", req{header: "Bearer h"}, "", "h"},
		{"header scheme is case-insensitive", req{header: "bearer  h "}, "", "h"},
		{"cookie", req{cookie: &http.Cookie{Name: "pushd_token", Value: "c"}}, "", "c"},
		{"named cookie", req{cookie: &http.Cookie{Name: "tok", Value: "c"}}, "tok", "c"},
		{"default cookie ignored when another is named", req{cookie: &http.Cookie{Name: "pushd_token", Value: "c"}}, "tok", ""},
		{"query", req{query: "access_token=q&task=t1"}, "", "q"},
		{"header wins", req{header: "Bearer h", cookie: &http.Cookie{Name: "pushd_token", Value: "c"}, query: "access_token=q"}, "", "h"},
		{"cookie beats query", req{cookie: &http.Cookie{Name: "pushd_token", Value: "c"}, query: "access_token=q"}, "", "c"},
		{"other scheme ignored", req{header: "Basic dXNlcjpwYXNz", query: "access_token=q"}, "", "q"},
		{"empty bearer ignored", req{header: "Bearer ", cookie: &http.Cookie{Name: "pushd_token", Value: "c"}}, "", "c"},
		{"scheme without space ignored", req{header: "Bearerh"}, "", ""},
		{"empty query value", req{query: "access_token="}, "", ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := httptest.NewRequest(http.MethodGet, "/v1/events?"+tc.r.query, nil)
			if tc.r.header != "" {
				r.Header.Set("Authorization", tc.r.header)
			}
			if tc.r.cookie != nil {
				r.AddCookie(tc.r.cookie)
			}
			if got := auth.TokenFromRequest(r, tc.cookie); got != tc.want {
				t.Errorf("TokenFromRequest = %q, want %q", got, tc.want)
			}
		})
	}
}

// TestAuthenticate drives Authenticate from a real handler over a real
// socket, as the transports will.
func TestAuthenticate(t *testing.T) {
	v := newVerifier(t, auth.Config{Secret: testSecret, CookieName: "sess"})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p, err := v.Authenticate(r)
		switch {
		case errors.Is(err, auth.ErrMissingToken):
			http.Error(w, "missing", http.StatusUnauthorized)
		case errors.Is(err, auth.ErrTokenExpired):
			http.Error(w, "expired", http.StatusUnauthorized)
		case errors.Is(err, auth.ErrInvalidToken):
			http.Error(w, "invalid", http.StatusUnauthorized)
		case err != nil:
			http.Error(w, "unexpected error: "+err.Error(), http.StatusInternalServerError)
		default:
			w.Write([]byte(p.TenantID + "/" + p.UserID))
		}
	}))
	t.Cleanup(srv.Close)

	signer := auth.NewSigner(testSecret)
	tokenFor := func(user string) string {
		tok, err := signer.Sign(auth.Principal{TenantID: "t1", UserID: user, ExpiresAt: time.Now().Add(time.Minute)})
		if err != nil {
			t.Fatalf("Sign: %v", err)
		}
		return tok
	}
	expired := sign(t, jwt.SigningMethodHS256, testSecret, jwt.MapClaims{"sub": "u", "tenant_id": "t1", "exp": time.Now().Add(-time.Hour).Unix()})

	do := func(header, cookie, query string) (int, string) {
		t.Helper()
		r, err := http.NewRequest(http.MethodGet, srv.URL+"/v1/events?"+query, nil)
		if err != nil {
			t.Fatal(err)
		}
		if header != "" {
			r.Header.Set("Authorization", "Bearer "+header)
		}
		if cookie != "" {
			r.AddCookie(&http.Cookie{Name: "sess", Value: cookie})
		}
		resp, err := srv.Client().Do(r)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var b [256]byte
		n, _ := resp.Body.Read(b[:])
		return resp.StatusCode, string(b[:n])
	}

	cases := []struct {
		name                  string
		header, cookie, query string
		wantCode              int
		wantBody              string
	}{
		{"header", tokenFor("h"), "", "", 200, "t1/h"},
		{"cookie", "", tokenFor("c"), "", 200, "t1/c"},
		{"query", "", "", "access_token=" + url.QueryEscape(tokenFor("q")), 200, "t1/q"},
		{"header wins", tokenFor("h"), tokenFor("c"), "access_token=" + tokenFor("q"), 200, "t1/h"},
		{"a bad header is not rescued by a good cookie", "garbage", tokenFor("c"), "", 401, "invalid\n"},
		{"missing", "", "", "task=t1", 401, "missing\n"},
		{"expired", expired, "", "", 401, "expired\n"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			code, body := do(tc.header, tc.cookie, tc.query)
			if code != tc.wantCode || body != tc.wantBody {
				t.Errorf("got %d %q, want %d %q", code, body, tc.wantCode, tc.wantBody)
			}
		})
	}
}
