package main

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pushd/pushd/internal/testenv"
)

// taskDoc is the part of a snapshot the tests look at.
type taskDoc struct {
	TaskID    string `json:"task_id"`
	TenantID  string `json:"tenant_id"`
	ProjectID string `json:"project_id"`
	UserID    string `json:"user_id"`
	Status    string `json:"status"`
	Progress  int    `json:"progress"`
	Version   int64  `json:"version"`
	UpdatedAt int64  `json:"updated_at"`
}

func snapshotJSON(version int64, status string, progress int) string {
	return fmt.Sprintf(`{"task_id":"task_1","tenant_id":"t1","project_id":"p1","user_id":"u1","status":%q,"progress":%d,"version":%d,"updated_at":1710000000000}`,
		status, progress, version)
}

// publish posts a snapshot from loopback without an API key, as the
// embedded mode's startup log suggests.
func publish(t *testing.T, base string, version int64, status string, progress int) {
	t.Helper()
	resp, body := httpDo(t, http.MethodPost, base+"/v1/publish", "", snapshotJSON(version, status, progress))
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("publish v%d: %d %s", version, resp.StatusCode, body)
	}
	var res struct {
		Written bool   `json:"written"`
		TaskID  string `json:"task_id"`
		Version int64  `json:"version"`
	}
	decode(t, body, &res)
	if !res.Written || res.TaskID != "task_1" || res.Version != version {
		t.Fatalf("publish v%d answered %s", version, body)
	}
}

// wantTask reads the next event and checks it is task_1 at version.
func wantTask(t *testing.T, c *sseClient, version int64, status string, progress int) {
	t.Helper()
	ev := c.NextOf(t, "task")
	if ev.ID == "" {
		t.Errorf("task event v%d has no id: line", version)
	}
	var got taskDoc
	decode(t, []byte(ev.Data), &got)
	want := taskDoc{TaskID: "task_1", TenantID: "t1", ProjectID: "p1", UserID: "u1", Status: status, Progress: progress, Version: version, UpdatedAt: 1710000000000}
	if got != want {
		t.Fatalf("task event %+v, want %+v", got, want)
	}
}

func demoToken(t *testing.T, base string) string {
	t.Helper()
	resp, body := httpDo(t, http.MethodGet, base+"/demo/token?tenant=t1&user=u1", "", "")
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /demo/token: %d %s", resp.StatusCode, body)
	}
	var tok struct {
		Token    string `json:"token"`
		TenantID string `json:"tenant_id"`
		UserID   string `json:"user_id"`
	}
	decode(t, body, &tok)
	if tok.Token == "" || tok.TenantID != "t1" || tok.UserID != "u1" {
		t.Fatalf("GET /demo/token answered %s", body)
	}
	return tok.Token
}

func wantHealthy(t *testing.T, base string) {
	t.Helper()
	if resp, body := httpDo(t, http.MethodGet, base+"/healthz", "", ""); resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /healthz: %d %s", resp.StatusCode, body)
	}
}

// wantDrained checks the stream tells the client when to come back and
// then ends.
func wantDrained(t *testing.T, c *sseClient) {
	t.Helper()
	ev := c.NextOf(t, "reconnect")
	var rc struct {
		AfterMS int `json:"after_ms"`
	}
	decode(t, []byte(ev.Data), &rc)
	if rc.AfterMS <= 0 || rc.AfterMS > 5000 || ev.Retry != rc.AfterMS {
		t.Errorf("reconnect after_ms %d retry %d, want equal and in (0, 5000] (--reconnect-after 5s)", rc.AfterMS, ev.Retry)
	}
	c.Ended(t)
}

// TestBinaryEmbeddedModeDeliversPublish runs the README's quick start: the
// built binary with no configuration serves the embedded mode, hands out
// demo tokens, streams a task published over HTTP and drains on SIGTERM.
func TestBinaryEmbeddedModeDeliversPublish(t *testing.T) {
	p := startBinary(t)
	wantHealthy(t, p.URL)

	// The startup log says how the node runs and how to feed it. The hints
	// follow the listener, so they may still be on their way.
	wants := []string{
		"embedded mode",
		p.URL + "/demo/token?tenant=t1&user=u1",
		p.URL + "/v1/events?task=task_1",
		"curl -X POST " + p.URL + "/v1/publish",
	}
	for _, want := range wants {
		testenv.Eventually(t, "the startup log says "+want, func() bool { return strings.Contains(p.log.String(), want) })
	}

	tok := demoToken(t, p.URL)
	c := openSSE(t, p.URL, "/v1/events?task=task_1", tok)
	hello := c.NextOf(t, "hello")
	var h struct {
		ConnID string `json:"conn_id"`
	}
	decode(t, []byte(hello.Data), &h)
	if h.ConnID == "" || hello.Retry <= 0 {
		t.Errorf("hello %s retry %d, want a conn_id and a retry", hello.Data, hello.Retry)
	}
	var nf struct {
		Code   string `json:"code"`
		TaskID string `json:"task_id"`
	}
	decode(t, []byte(c.NextOf(t, "error").Data), &nf)
	if nf.Code != "not_found" || nf.TaskID != "task_1" {
		t.Fatalf("error event %+v, want not_found for task_1", nf)
	}

	// The task does not exist yet but stays watched.
	publish(t, p.URL, 1, "RUNNING", 45)
	wantTask(t, c, 1, "RUNNING", 45)
	publish(t, p.URL, 2, "SUCCEEDED", 100)
	wantTask(t, c, 2, "SUCCEEDED", 100)

	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	wantDrained(t, c)
	if code := p.waitExit(t); code != 0 {
		t.Fatalf("exit code %d after SIGTERM, want 0", code)
	}
	for _, want := range []string{`msg=draining`, `msg=stopped`} {
		if !strings.Contains(p.log.String(), want) {
			t.Errorf("shutdown log lacks %q", want)
		}
	}
}

// TestBinaryRefusesDemoTokenWhenSecretConfigured: an embedded node with a
// configured secret protects something real, so it hands out no tokens and
// does not advertise /demo/token.
func TestBinaryRefusesDemoTokenWhenSecretConfigured(t *testing.T) {
	p := startBinary(t, "--jwt-secret", "s3cret")
	wantHealthy(t, p.URL)

	resp, body := httpDo(t, http.MethodGet, p.URL+"/demo/token?tenant=t1&user=u1", "", "")
	if resp.StatusCode != http.StatusNotFound {
		t.Fatalf("GET /demo/token: %d %s, want 404", resp.StatusCode, body)
	}
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
		t.Errorf("Content-Type %q, want JSON", ct)
	}
	var e struct{ Error, Message string }
	decode(t, body, &e)
	if e.Error != "not_found" || e.Message == "" {
		t.Errorf("body %s, want a not_found JSON error", body)
	}
	if log := p.log.String(); !strings.Contains(log, "embedded mode") || strings.Contains(log, "/demo/token") {
		t.Errorf("startup log should say embedded and not offer /demo/token:\n%s", log)
	}

	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code := p.waitExit(t); code != 0 {
		t.Fatalf("exit code %d after SIGTERM, want 0", code)
	}
}

// TestRunDrainsOnSignal runs run in this process (so the race detector
// watches the startup and drain paths) and stops it with SIGTERM, which
// run's signal.NotifyContext catches once it has logged the address.
func TestRunDrainsOnSignal(t *testing.T) {
	log := newLogBuffer()
	returned := make(chan struct{})
	var runErr error
	go func() {
		defer close(returned)
		runErr = run([]string{"--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0", "--node-name", "in-process", "--reconnect-after", "1s"},
			nil, io.Discard, log)
	}()
	serving := false
	t.Cleanup(func() {
		select {
		case <-returned:
		default:
			if serving { // run catches the signal; before that it would kill the tests
				syscall.Kill(syscall.Getpid(), syscall.SIGTERM)
				select {
				case <-returned:
				case <-time.After(waitFor):
				}
			}
			t.Error("run still running at the end of the test")
		}
		if t.Failed() {
			t.Logf("run log:\n%s", log)
		}
	})
	base := "http://" + log.wait(t, servingRE, returned)[1]
	serving = true
	wantHealthy(t, base)
	c := openSSE(t, base, "/v1/events?task=task_1", demoToken(t, base))
	c.NextOf(t, "hello")
	c.NextOf(t, "error")
	publish(t, base, 1, "RUNNING", 45)
	wantTask(t, c, 1, "RUNNING", 45)

	if err := syscall.Kill(syscall.Getpid(), syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	ev := c.NextOf(t, "reconnect")
	if ev.Retry <= 0 || ev.Retry > 1000 {
		t.Errorf("reconnect retry %d, want in (0, 1000] (--reconnect-after 1s)", ev.Retry)
	}
	c.Ended(t)
	select {
	case <-returned:
	case <-time.After(waitFor):
		t.Fatalf("run still running %v after the signal", waitFor)
	}
	if runErr != nil {
		t.Fatalf("run: %v", runErr)
	}
	if !strings.Contains(log.String(), "msg=stopped") {
		t.Error("run returned without logging stopped")
	}
}

// Metrics are for operators: the client listener answers /metrics 404, as
// any path it does not serve, and the admin listener serves them, with
// the health checks.
func TestMetricsOnlyOnTheAdminListener(t *testing.T) {
	p := startBinary(t)
	resp, body := httpDo(t, http.MethodGet, p.URL+"/metrics", "", "")
	if resp.StatusCode != http.StatusNotFound || !strings.Contains(string(body), `"error":"not_found"`) {
		t.Fatalf("the client listener answered /metrics %d %s, want 404 not_found", resp.StatusCode, body)
	}
	resp, body = httpDo(t, http.MethodGet, p.AdminURL+"/metrics", "", "")
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), "pushd_connections") {
		t.Fatalf("the admin listener answered /metrics %d, want 200 with pushd's metrics:\n%.300s", resp.StatusCode, body)
	}
	for _, path := range []string{"/healthz", "/readyz"} {
		if resp, body := httpDo(t, http.MethodGet, p.AdminURL+path, "", ""); resp.StatusCode != http.StatusOK {
			t.Fatalf("the admin listener answered %s %d %s", path, resp.StatusCode, body)
		}
	}
	if resp, _ := httpDo(t, http.MethodGet, p.AdminURL+"/v1/events", "", ""); resp.StatusCode != http.StatusNotFound {
		t.Fatalf("the admin listener answered /v1/events %d, want 404: it serves no client routes", resp.StatusCode)
	}
}

// The admin and the debug listener answer only to their own names: a page
// that DNS-rebinds its name to either gets 403 host_not_allowed, on every
// route; an IP address, localhost and a name of --admin-hosts are served.
func TestAdminAndDebugListenersAnswerOnlyTheirOwnHosts(t *testing.T) {
	// localhost:0, not 127.0.0.1:0: --debug-listen must differ from --listen.
	p := startBinary(t, "--debug-listen", "localhost:0", "--admin-hosts", "pushd-admin.monitoring.svc")
	debugURL := "http://" + p.log.wait(t, regexp.MustCompile(`msg="pprof serving" addr=(\S+)`), p.exited)[1]
	get := func(u, host string) (*http.Response, []byte) {
		t.Helper()
		return httpDo(t, http.MethodGet, u, "", "", "Host", host)
	}
	for _, u := range []string{p.AdminURL + "/metrics", p.AdminURL + "/readyz", debugURL + "/debug/pprof/", debugURL + "/debug/pprof/cmdline"} {
		for _, host := range []string{"evil.example", "evil.example:9464", "localhost.evil.example"} {
			resp, body := get(u, host)
			if resp.StatusCode != http.StatusForbidden || !strings.Contains(string(body), `"error":"host_not_allowed"`) {
				t.Errorf("GET %s with Host %s: %d %.200s, want 403 host_not_allowed", u, host, resp.StatusCode, body)
			}
		}
		for _, host := range []string{"127.0.0.1", "localhost:1", "pushd-admin.monitoring.svc:9464"} {
			if resp, body := get(u, host); resp.StatusCode != http.StatusOK {
				t.Errorf("GET %s with Host %s: %d %.200s, want 200", u, host, resp.StatusCode, body)
			}
		}
	}
}

// The debug listener holds no connection without a deadline: a client that
// sends half a request is cut once --request-timeout passes, as on the
// node's other listeners.
func TestDebugListenerCutsAnUnfinishedRequest(t *testing.T) {
	p := startBinary(t, "--debug-listen", "localhost:0", "--request-timeout", "1s")
	addr := p.log.wait(t, regexp.MustCompile(`msg="pprof serving" addr=(\S+)`), p.exited)[1]
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := io.WriteString(conn, "GET /debug/pprof/ HTTP/1.1\r\nHost: 127.0.0.1\r\n"); err != nil {
		t.Fatal(err)
	}
	// Far past the timeout: a listener without one never closes.
	conn.SetReadDeadline(time.Now().Add(30 * time.Second))
	_, err = io.Copy(io.Discard, conn)
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		t.Fatal("the debug listener kept a half-sent request's connection open past 30 s; --request-timeout is 1s")
	}
}
