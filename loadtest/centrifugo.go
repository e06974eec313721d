package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/golang-jwt/jwt/v5"
)

// Centrifugo is measured as its users run it for task status pushes: the
// Redis engine on the run's private Redis, one namespace "task" whose
// channel task:<id> carries a task's snapshots, clients authenticated by an
// HS256 connection token whose channels claim subscribes them server-side
// (the one way a uni_sse client can subscribe; the WebSocket clients use it
// too, so both transports do the same work at connect), history off (pushd
// keeps no per-delivery history either), and the backend publishing over
// the HTTP API. The loadtest never builds Centrifugo: -centrifugo-bin names
// a binary built by whoever runs the comparison.

// centrifugoNamespace is the namespace of every task channel.
const centrifugoNamespace = "task"

func centrifugoChannel(task int) string { return centrifugoNamespace + ":" + taskID(task) }

// centrifugoConfig is the JSON configuration of a private Centrifugo: every
// endpoint (clients, API, /metrics, /health) on 127.0.0.1:port, the
// unidirectional SSE transport enabled beside the default bidirectional
// WebSocket one, logs at warn, no usage statistics sent anywhere.
func centrifugoConfig(port int, redisURL, tokenSecret, apiKey string) ([]byte, error) {
	cfg := map[string]any{
		"http_server": map[string]any{"address": "127.0.0.1", "port": port},
		"log":         map[string]any{"level": "warn"},
		"engine": map[string]any{
			"type":  "redis",
			"redis": map[string]any{"address": []string{redisURL}},
		},
		"client":   map[string]any{"token": map[string]any{"hmac_secret_key": tokenSecret}},
		"http_api": map[string]any{"key": apiKey},
		"uni_sse":  map[string]any{"enabled": true},
		// history_size 0: no history, no recovery, as pushd.
		"channel":     map[string]any{"namespaces": []any{map[string]any{"name": centrifugoNamespace, "history_size": 0}}},
		"prometheus":  map[string]any{"enabled": true},
		"health":      map[string]any{"enabled": true},
		"usage_stats": map[string]any{"disabled": true},
	}
	return json.MarshalIndent(cfg, "", "  ")
}

// centrifugoVersion names the binary for the result's commit column.
func centrifugoVersion(ctx context.Context, bin string) (string, error) {
	out, err := exec.CommandContext(ctx, bin, "version").Output()
	if err != nil {
		return "", fmt.Errorf("-centrifugo-bin %s: %w", bin, err)
	}
	v := strings.TrimSpace(string(out))
	v, _, _ = strings.Cut(v, " (")
	return v + " (" + filepath.Base(bin) + ")", nil
}

// startCentrifugo writes the run's configuration and starts Centrifugo on
// a free port, with the run's Redis and token secret.
func (r *run) startCentrifugo(ctx context.Context, bin string) error {
	port, err := freePort()
	if err != nil {
		return err
	}
	apiKey := randomHex(16)
	b, err := centrifugoConfig(port, r.redis.url(), string(r.secret), apiKey)
	if err != nil {
		return err
	}
	path := filepath.Join(r.tmp, "centrifugo.json")
	if err := os.WriteFile(path, b, 0o600); err != nil {
		return err
	}
	r.nodes = fleet{&serverProc{name: "centrifugo", health: "/health", bin: bin, args: []string{"--config", path},
		env: r.cfg.serverEnv(), port: port, logDir: r.tmp, cpus: r.cfg.serverCPUs()}}
	r.res.Server.Env = r.cfg.serverEnv()
	if err := r.nodes.start(ctx); err != nil {
		return err
	}
	r.pub = newPublisher(newCentrifugoAPI(r.nodes[0].baseURL(), apiKey, r.cfg.Publishers), nil, "off",
		r.cfg.Tasks, r.cfg.Tenants, r.cfg.Publishers, r.cfg.SnapshotBytes)
	r.pub.every = r.cfg.PubEvery
	r.pub.fromWrite = r.cfg.LatencyFrom == "write"
	return nil
}

// centrifugoAPI publishes a snapshot as the backend of a Centrifugo
// deployment does: one HTTP API publish per update, over keep-alive
// connections, one per publisher goroutine.
type centrifugoAPI struct {
	url    string // .../api/publish
	key    string
	client *http.Client
}

var _ store = (*centrifugoAPI)(nil)

func newCentrifugoAPI(base, key string, inFlight int) *centrifugoAPI {
	return &centrifugoAPI{url: base + "/api/publish", key: key, client: &http.Client{Transport: &http.Transport{
		MaxIdleConns: inFlight + 8, MaxIdleConnsPerHost: inFlight + 8, IdleConnTimeout: time.Minute,
	}}}
}

// store publishes doc to task i's channel. Centrifugo has no versions: it
// forwards whatever it is given, so written is always true.
func (a *centrifugoAPI) store(ctx context.Context, i int, doc []byte) (bool, error) {
	body := make([]byte, 0, len(doc)+64)
	body = append(body, `{"channel":"`...)
	body = append(body, centrifugoChannel(i)...)
	body = append(body, `","data":`...)
	body = append(body, doc...)
	body = append(body, '}')
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, a.url, bytes.NewReader(body))
	if err != nil {
		return false, err
	}
	req.Header.Set("X-API-Key", a.key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := a.client.Do(req)
	if err != nil {
		return false, fmt.Errorf("centrifugo publish: %w", err)
	}
	defer resp.Body.Close()
	reply, err := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if err != nil {
		return false, fmt.Errorf("centrifugo publish: %w", err)
	}
	// Errors come back as 200 with an error object in the default error mode.
	if resp.StatusCode != http.StatusOK || bytes.Contains(reply, []byte(`"error"`)) {
		return false, fmt.Errorf("centrifugo publish: status %d: %s", resp.StatusCode, bytes.TrimSpace(reply))
	}
	return true, nil
}

// centrifugoToken is a connection token for task's user that subscribes
// the connection to task's channel.
func centrifugoToken(secret []byte, task, tenants int) (string, error) {
	claims := jwt.MapClaims{
		"sub":      userOf(task, tenants),
		"exp":      time.Now().Add(12 * time.Hour).Unix(),
		"channels": []string{centrifugoChannel(task)},
	}
	return jwt.NewWithClaims(jwt.SigningMethodHS256, claims).SignedString(secret)
}

// centrifugoConnect is the first command of a bidirectional JSON
// WebSocket client, as centrifuge-js sends it.
func centrifugoConnect(token string) []byte {
	return []byte(`{"id":1,"connect":{"token":"` + token + `","name":"loadtest"}}`)
}

// onCentrifugo handles one push of Centrifugo's JSON protocol: over
// uni_sse as is ({"channel":...,"pub":...}, {"connect":...}), over the
// bidirectional WebSocket wrapped in {"push":...}. A publication's data is
// the publisher's snapshot document, which onTask reads; the connect push
// is not a task (its "version" is the server's).
func (c *conn) onCentrifugo(msg []byte, recv int64) {
	msg, _ = bytes.CutPrefix(msg, []byte(`{"push":`))
	switch {
	case bytes.HasPrefix(msg, []byte(`{"channel":`)):
		if i := bytes.Index(msg, []byte(`"pub":{"data":`)); i >= 0 {
			c.onTask(msg[i:], recv)
		}
	case bytes.HasPrefix(msg, []byte(`{"disconnect":`)):
		code, _ := jsonInt(msg, `"code":`)
		c.w.countErr("centrifugo_disconnect_" + strconv.FormatInt(code, 10))
	}
}

// centrifugoError is an error reply to the connect command.
type centrifugoError struct{ code int64 }

func (e centrifugoError) Error() string { return "centrifugo error " + strconv.FormatInt(e.code, 10) }
