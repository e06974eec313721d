package adminhost_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/pushd/pushd/internal/adminhost"
)

func TestAllowedHosts(t *testing.T) {
	names := []string{"pushd-admin.monitoring.svc"}
	for host, want := range map[string]bool{
		"127.0.0.1": true, "127.0.0.1:9464": true, "10.42.7.3:9464": true, "[::1]:9464": true, "[::1]": true,
		"::1": true, "[fe80::1%25eth0]:9464": true, "localhost": true, "localhost:9464": true, "LocalHost.:9464": true,
		"pushd-admin.monitoring.svc": true, "pushd-admin.monitoring.svc.:9464": true, "PUSHD-ADMIN.Monitoring.svc:1": true,

		"": false, ":9464": false, "evil.example": false, "evil.example:9464": false, "localhost.evil.example": false,
		"pushd-admin.monitoring.svc.evil.example": false, "monitoring.svc": false, "127.0.0.1.nip.io:9464": false,
		"[::1]evil:9464": false, "2130706433": false, "0x7f.1": false, "[evil.example]:9464": false, ".": false,
	} {
		if got := adminhost.Allowed(host, names); got != want {
			t.Errorf("Allowed(%q) = %v, want %v", host, got, want)
		}
	}
}

func TestHandlerRefusesOtherHostsWithJSON(t *testing.T) {
	served := 0
	h := adminhost.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { served++ }), []string{" Pushd-Admin.monitoring.svc. "})
	for _, host := range []string{"pushd-admin.monitoring.svc:9464", "127.0.0.1:9464"} {
		r := httptest.NewRequest(http.MethodGet, "/metrics", nil)
		r.Host = host
		h.ServeHTTP(httptest.NewRecorder(), r)
	}
	if served != 2 {
		t.Errorf("served %d of the listed name and the IP, want 2", served)
	}
	r := httptest.NewRequest(http.MethodGet, "/anything", nil)
	r.Host = "rebound.evil.example:9464"
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	var body struct{ Error, Message string }
	if err := json.Unmarshal(w.Body.Bytes(), &body); w.Code != http.StatusForbidden || err != nil ||
		body.Error != "host_not_allowed" || body.Message == "" || w.Header().Get("Content-Type") != "application/json" {
		t.Errorf("answered %d %q %s, want 403 with a JSON host_not_allowed", w.Code, w.Header().Get("Content-Type"), w.Body)
	}
	if served != 2 {
		t.Error("served a foreign Host")
	}
}
