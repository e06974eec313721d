package api_test

import (
	"bufio"
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/pushd/pushd/admission"
	"github.com/pushd/pushd/node/internal/api"
)

// The node's own per-address limits are counted with admission's rules,
// so every 429 is in rate_limit_rejected_total: the failed-authentication
// limit under the endpoint it guarded, the per-address connection cap
// under connect, each with the wait it asked for.
func TestNodeLimitsCountedWithTheRateLimits(t *testing.T) {
	adm := admission.New(admission.Config{}) // no limits of its own
	t.Cleanup(adm.Close)
	n := newNode(t, func(c *api.Config) {
		c.AuthFailureBurst, c.AuthFailureRate = 1, 0.01
		c.MaxConnsPerIP = 1
		c.Admission = adm
	})

	// From one address: an invalid token passes the limiter (and takes its
	// only token), the next is refused.
	const addr = "203.0.113.9:4000"
	wantError(t, "invalid token", serveFrom(n.h, addr, req{method: "GET", path: "/v1/tasks/task_x", header: bearer("bad.to.ken")}), 401, "unauthorized")
	refusedAuth := serveFrom(n.h, addr, req{method: "GET", path: "/v1/tasks/task_x", header: bearer("bad.to.ken")})
	wantError(t, "past the burst", refusedAuth, 429, "rate_limit_exceeded")

	// From loopback: one stream open, the next refused by the cap.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	hr, _ := http.NewRequestWithContext(ctx, "GET", n.url+"/v1/events?task=task_x", nil)
	hr.Header.Set("Authorization", "Bearer "+n.token(t, time.Now().Add(time.Hour)))
	resp, err := http.DefaultClient.Do(hr)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("first stream: %v %v", resp, err)
	}
	defer resp.Body.Close()
	// The hello says the hub registered it.
	for br := bufio.NewReader(resp.Body); ; {
		line, err := br.ReadString('\n')
		if err != nil {
			t.Fatalf("first stream ended before its hello: %v", err)
		}
		if strings.HasPrefix(line, "event: hello") {
			break
		}
	}
	wantError(t, "second stream", do(t, n.url, req{method: "GET", path: "/v1/events?task=task_x", header: bearer(n.token(t, time.Now().Add(time.Hour)))}), 429, "too_many_connections")

	s := adm.Stats()
	got := make(map[[2]string]admission.RuleStats)
	for _, r := range s.Rules {
		got[[2]string{r.Endpoint, r.Rule}] = r
	}
	for _, w := range []struct {
		endpoint, rule    string
		allowed, rejected int64
	}{
		{"task", admission.RuleAuthFailures, 1, 1},
		{admission.EndpointConnect, admission.RuleAuthFailures, 1, 0}, // the second stream was refused before its token was looked at
		{admission.EndpointConnect, admission.RuleConnsPerIP, 1, 1},
	} {
		r := got[[2]string{w.endpoint, w.rule}]
		if r.Allowed != w.allowed || r.Rejected != w.rejected || r.RetryAfter.Count != uint64(w.rejected) {
			t.Errorf("%s %s: allowed %d, rejected %d, %d waits; want %d, %d, %d", w.endpoint, w.rule, r.Allowed, r.Rejected, r.RetryAfter.Count, w.allowed, w.rejected, w.rejected)
		}
	}
	if r := got[[2]string{admission.EndpointConnect, admission.RuleConnsPerIP}]; r.RetryAfter.Sum != 5*time.Second {
		t.Errorf("the cap's wait %s, want 5s", r.RetryAfter.Sum)
	}
	if len(got) != 3 {
		t.Errorf("%d rule counters, want 3: %+v", len(got), s.Rules)
	}
}
