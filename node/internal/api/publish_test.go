package api_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/pushd/pushd/fanout"
	"github.com/pushd/pushd/internal/testenv"
	"github.com/pushd/pushd/node/internal/api"
	"github.com/pushd/pushd/snapshot"
)

// publish POSTs body to /v1/publish and returns the status and JSON body.
func publish(t *testing.T, url, body string) (int, map[string]any) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/publish", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("X-API-Key", "key")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	var out map[string]any
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatalf("status %d, body %q is not JSON: %v", resp.StatusCode, b, err)
	}
	return resp.StatusCode, out
}

func doc(task, tenant string, version int64, extra string) string {
	return fmt.Sprintf(`{"task_id":%q,"tenant_id":%q,"status":"RUNNING","version":%d%s}`, task, tenant, version, extra)
}

// POST /v1/publish refuses what would break a stored task's versions or
// tenant with a JSON error naming why: a document nested past
// snapshot.MaxDepth or a version past snapshot.MaxVersion (400), another
// tenant's snapshot of a stored task or a write over a stored document
// whose version cannot be read (409). None of them is stored.
func TestPublishRefusesWhatBreaksIntegrity(t *testing.T) {
	rd := testenv.SharedRedis(t)
	srv := httptest.NewServer(api.New(api.Config{
		Publisher: fanout.NewRedisPublisher(rd.Client, rd.Names),
		APIKey:    "key",
	}))
	t.Cleanup(srv.Close)
	task, unreadable := testenv.UniqueID("task"), testenv.UniqueID("task")
	if status, body := publish(t, srv.URL, doc(task, "t1", 2, "")); status != http.StatusOK || body["written"] != true {
		t.Fatalf("publish t1 v2: %d %v", status, body)
	}
	rd.Client.Set(context.Background(), rd.Names.Snapshot(unreadable), "not json", time.Minute)

	deep := `,"x":` + strings.Repeat("[", 1000) + strings.Repeat("]", 1000)
	for _, tc := range []struct {
		name, body string
		status     int
		code, says string
	}{
		{"nested too deep", doc(testenv.UniqueID("task"), "t1", 1, deep), 400, "invalid_snapshot", fmt.Sprintf("deeper than %d levels", snapshot.MaxDepth)},
		{"version 2^53", doc(testenv.UniqueID("task"), "t1", 1<<53, ""), 400, "invalid_snapshot", fmt.Sprint(int64(snapshot.MaxVersion))},
		{"version int64 max", doc(testenv.UniqueID("task"), "t1", 1<<63-1, ""), 400, "invalid_snapshot", fmt.Sprint(int64(snapshot.MaxVersion))},
		{"another tenant", doc(task, "t2", 3, ""), 409, api.TenantMismatch, "another tenant"},
		{"over an unreadable document", doc(unreadable, "t1", 1, ""), 409, api.StoredUnreadable, "cannot be read"},
	} {
		status, body := publish(t, srv.URL, tc.body)
		msg, _ := body["message"].(string)
		if status != tc.status || body["error"] != tc.code || !strings.Contains(msg, tc.says) {
			t.Errorf("%s: %d %v; want %d, error %q, a message saying %q", tc.name, status, body, tc.status, tc.code, tc.says)
		}
	}
	got, err := snapshot.Parse([]byte(rd.Client.Get(context.Background(), rd.Names.Snapshot(task)).Val()))
	if err != nil || got.TenantID != "t1" || got.Version != 2 {
		t.Errorf("stored %+v, %v; want t1 v2", got, err)
	}
	if s := rd.Client.Get(context.Background(), rd.Names.Snapshot(unreadable)).Val(); s != "not json" {
		t.Errorf("the unreadable document was replaced by %q", s)
	}
}
