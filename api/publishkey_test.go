package api_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/pushd/pushd/api"
	"github.com/pushd/pushd/fanout"
	"github.com/pushd/pushd/snapshot"
	"github.com/pushd/pushd/testenv"
)

// stored returns the snapshot Redis holds for task, or nil.
func stored(t *testing.T, rd testenv.Redis, task string) *snapshot.Snapshot {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	raw, err := rd.Client.Get(ctx, rd.Names.Snapshot(task)).Bytes()
	if err != nil {
		return nil
	}
	s, err := snapshot.Parse(raw)
	if err != nil {
		t.Fatalf("stored snapshot of %s: %v", task, err)
	}
	return s
}

// POST /v1/publish with Config.APIKey set takes the key from X-API-Key and
// nowhere else: a missing, empty or wrong header, the key in another
// header or in the query string (under any name) is a 401 with a JSON
// error, from loopback too, and nothing is stored; the key never reaches
// the log. With the right header the snapshot is stored and announced on
// the tenant's channel.
func TestPublishKey(t *testing.T) {
	rd := testenv.SharedRedis(t)
	key := "pk-" + testenv.RandomSuffix(16)
	var logs logBuffer
	srv := httptest.NewServer(api.New(api.Config{
		Publisher: fanout.NewRedisPublisher(rd.Client, rd.Names),
		APIKey:    key,
		Logger:    logs.logger(),
	}))
	t.Cleanup(srv.Close)
	tenant := testenv.UniqueID("tenant")

	for _, tc := range []struct {
		name   string
		query  string
		header map[string]string
		status int
		code   string
	}{
		{"no header", "", nil, 401, "unauthorized"},
		{"empty header", "", map[string]string{"X-API-Key": ""}, 401, "unauthorized"},
		{"wrong key of the same length", "", map[string]string{"X-API-Key": strings.Repeat("x", len(key))}, 401, "unauthorized"},
		{"a prefix of the key", "", map[string]string{"X-API-Key": key[:len(key)-1]}, 401, "unauthorized"},
		{"the key and more", "", map[string]string{"X-API-Key": key + "x"}, 401, "unauthorized"},
		{"the key upper-cased", "", map[string]string{"X-API-Key": strings.ToUpper(key)}, 401, "unauthorized"},
		{"the key as a bearer token", "", map[string]string{"Authorization": "Bearer " + key}, 401, "unauthorized"},
		{"the key as another header", "", map[string]string{"X-Api-Token": key, "Api-Key": key}, 401, "unauthorized"},
		{"?api_key=", "?api_key=" + key, nil, 401, "unauthorized"},
		{"?key=", "?key=" + key, nil, 401, "unauthorized"},
		{"?X-API-Key=", "?X-API-Key=" + key, nil, 401, "unauthorized"},
		{"?access_token=", "?access_token=" + key, nil, 401, "unauthorized"},
		// With the right header the query is still no place for a key: the
		// parameter is refused, without its value in the message.
		{"right header and ?api_key=", "?api_key=" + key, map[string]string{"X-API-Key": key}, 400, "unknown_parameter"},
	} {
		task := testenv.UniqueID("task")
		r := do(t, srv.URL, req{method: "POST", path: "/v1/publish" + tc.query, header: tc.header, body: doc(task, tenant, 1, "")})
		wantError(t, tc.name, r, tc.status, tc.code)
		if strings.Contains(string(r.body), key) {
			t.Errorf("%s: the answer %q repeats the key", tc.name, r.body)
		}
		if s := stored(t, rd, task); s != nil {
			t.Errorf("%s: stored %s v%d", tc.name, s.TaskID, s.Version)
		}
	}

	// The right key: stored, and announced to the tenant's channel.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	sub := rd.Client.Subscribe(ctx, rd.Names.Channel(tenant))
	defer sub.Close()
	if _, err := sub.Receive(ctx); err != nil { // the subscription's confirmation
		t.Fatal(err)
	}
	task := testenv.UniqueID("task")
	r := do(t, srv.URL, req{method: "POST", path: "/v1/publish", header: map[string]string{"X-API-Key": key}, body: doc(task, tenant, 3, "")})
	var res struct {
		Written bool   `json:"written"`
		TaskID  string `json:"task_id"`
		Version int64  `json:"version"`
	}
	if err := json.Unmarshal(r.body, &res); r.status != http.StatusOK || err != nil || !res.Written || res.TaskID != task || res.Version != 3 {
		t.Fatalf("publish with the key: %d %q", r.status, r.body)
	}
	if s := stored(t, rd, task); s == nil || s.TenantID != tenant || s.Version != 3 {
		t.Fatalf("stored %+v, want %s v3 of %s", s, task, tenant)
	}
	msg, err := sub.ReceiveMessage(ctx)
	if err != nil {
		t.Fatalf("no announcement: %v", err)
	}
	var n fanout.Notification
	if err := json.Unmarshal([]byte(msg.Payload), &n); err != nil || n.TaskID != task || n.Version != 3 {
		t.Fatalf("announced %q on %s (%v), want %s v3", msg.Payload, msg.Channel, err, task)
	}

	out := logs.String()
	if !strings.Contains(out, "request refused") {
		t.Fatalf("the refusals were not logged at debug level, so the check below proves nothing:\n%s", out)
	}
	if strings.Contains(out, key) {
		t.Errorf("the key is in the log:\n%s", out)
	}
}
