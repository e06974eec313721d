package node_test

import (
	"encoding/json"
	"net"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/pushd/pushd/internal/testenv"
)

// A page that rebinds its own DNS name to the admin address makes the
// victim's browser send that name as Host: the admin listener refuses
// every name but its own (IP literals, localhost, --admin-hosts) on every
// route, so the inspector's users and the metrics never reach the page.
// Prometheus, which scrapes pod IPs, and an operator's curl to 127.0.0.1
// or to a listed service name are served.
func TestAdminListenerRefusesForeignHosts(t *testing.T) {
	c := newCluster(t)
	cfg := c.config()
	cfg.AdminHosts = []string{"pushd-admin.monitoring.svc"}
	s := startNode(t, cfg)
	task := testenv.UniqueID("task")
	c.goPublish(t, doc(task, "t1", 1, "RUNNING"))
	u, err := url.Parse(s.AdminURL)
	if err != nil {
		t.Fatal(err)
	}
	_, port, _ := net.SplitHostPort(u.Host)
	paths := []string{"/inspect/tasks/" + task, "/metrics", "/healthz", "/nowhere"}

	for _, host := range []string{"evil.example:" + port, "evil.example", "localhost.evil.example:" + port,
		"pushd-admin.monitoring.svc.evil.example:" + port, "127.0.0.1.nip.io:" + port, "[::1]evil:" + port} {
		for _, path := range paths {
			resp, body := httpDo(t, http.MethodGet, s.AdminURL+path, "", "", "Host", host)
			if resp.StatusCode != http.StatusForbidden {
				t.Errorf("GET %s with Host %s: %d, want 403: %.200s", path, host, resp.StatusCode, body)
				continue
			}
			var e struct{ Error, Message string }
			if err := json.Unmarshal(body, &e); err != nil || e.Error != "host_not_allowed" || e.Message == "" {
				t.Errorf("GET %s with Host %s: body %s, want the JSON error host_not_allowed", path, host, body)
			}
			if strings.Contains(string(body), "t1") || strings.Contains(string(body), "u1") {
				t.Errorf("GET %s with Host %s: the refusal names a tenant or user: %s", path, host, body)
			}
		}
	}

	for _, host := range []string{"127.0.0.1:" + port, "127.0.0.1", "10.42.7.3:" + port, "[::1]:" + port, "[fd00::7]",
		"localhost:" + port, "localhost", "LOCALHOST.", "pushd-admin.monitoring.svc:" + port, "PUSHD-ADMIN.monitoring.svc."} {
		resp, body := httpDo(t, http.MethodGet, s.AdminURL+"/inspect/tasks/"+task, "", "", "Host", host)
		if resp.StatusCode != http.StatusOK {
			t.Errorf("inspector with Host %s: %d, want 200: %.200s", host, resp.StatusCode, body)
			continue
		}
		var got inspected
		if err := json.Unmarshal(body, &got); err != nil || got.TaskID != task {
			t.Errorf("inspector with Host %s: %s, want task %s", host, body, task)
		}
		resp, body = httpDo(t, http.MethodGet, s.AdminURL+"/metrics", "", "", "Host", host)
		if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), "pushd_connections") {
			t.Errorf("/metrics with Host %s: %d, want 200 with pushd's metrics: %.200s", host, resp.StatusCode, body)
		}
	}
}
