package snapshot_test

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/pushd/pushd/snapshot"
	"github.com/pushd/pushd/snapshot/snapshottest"
)

func TestParseKeepsDocumentVerbatim(t *testing.T) {
	t.Parallel()
	in := `{"task_id":"task_123","tenant_id":"t1","project_id":"p1","user_id":"u1",` +
		`"status":"RUNNING","progress":45,"stage":"provider_generating","preview_asset_id":null,` +
		`"version":18,"updated_at":1710000000000,"new_field":{"nested":[1,"two",null]},"z": 1}`
	s, err := snapshot.Parse([]byte(in))
	if err != nil {
		t.Fatal(err)
	}
	if string(s.JSON()) != in {
		t.Errorf("JSON() = %s, want the input verbatim", s.JSON())
	}
	want := snapshot.Snapshot{TaskID: "task_123", TenantID: "t1", ProjectID: "p1", UserID: "u1",
		Status: "RUNNING", Version: 18, UpdatedAt: 1710000000000}
	if s.TaskID != want.TaskID || s.TenantID != want.TenantID || s.ProjectID != want.ProjectID ||
		s.UserID != want.UserID || s.Status != want.Status || s.Version != want.Version || s.UpdatedAt != want.UpdatedAt {
		t.Errorf("fields = %+v, want %+v", s, &want)
	}
	// Forwarded inside other JSON (encoding/json compacts what
	// MarshalJSON returns, hence the one space fewer).
	out, err := json.Marshal(map[string]any{"task": s})
	if err != nil || string(out) != `{"task":`+strings.Replace(in, `"z": 1`, `"z":1`, 1)+`}` {
		t.Errorf("marshal = %s, %v", out, err)
	}
	// The input buffer may be reused by the caller.
	buf := []byte(in)
	s2 := snapshottest.MustParse(t, buf)
	buf[2] = 'X'
	if string(s2.JSON()) != in {
		t.Error("Parse kept a reference to its input")
	}
}

func TestParseCompactsNewlines(t *testing.T) {
	t.Parallel()
	s := snapshottest.MustParse(t, []byte("{\n  \"task_id\": \"a\",\r\n  \"tenant_id\": \"t1\",\n  \"version\": 1\n}"))
	if got := string(s.JSON()); got != `{"task_id":"a","tenant_id":"t1","version":1}` {
		t.Errorf("JSON() = %q", got)
	}
}

func TestParseRejects(t *testing.T) {
	t.Parallel()
	for name, in := range map[string]string{
		"empty":            ``,
		"not json":         `task`,
		"array":            `[{"task_id":"a","tenant_id":"t","version":1}]`,
		"truncated":        `{"task_id":"a","tenant_id":"t","version":1`,
		"trailing":         `{"task_id":"a","tenant_id":"t","version":1} x`,
		"no task":          `{"tenant_id":"t","version":1}`,
		"bad task":         `{"task_id":"a b","tenant_id":"t","version":1}`,
		"no tenant":        `{"task_id":"a","version":1}`,
		"bad tenant":       `{"task_id":"a","tenant_id":"{t}","version":1}`,
		"bad project":      `{"task_id":"a","tenant_id":"t","project_id":"p/1","version":1}`,
		"bad user":         `{"task_id":"a","tenant_id":"t","user_id":"u\n","version":1}`,
		"no version":       `{"task_id":"a","tenant_id":"t"}`,
		"null version":     `{"task_id":"a","tenant_id":"t","version":null}`,
		"zero version":     `{"task_id":"a","tenant_id":"t","version":0}`,
		"negative":         `{"task_id":"a","tenant_id":"t","version":-3}`,
		"string version":   `{"task_id":"a","tenant_id":"t","version":"3"}`,
		"float version":    `{"task_id":"a","tenant_id":"t","version":3.5}`,
		"string updated":   `{"task_id":"a","tenant_id":"t","version":3,"updated_at":"2024-01-01"}`,
		"too large":        `{"task_id":"a","tenant_id":"t","version":1,"pad":"` + strings.Repeat("x", snapshot.MaxSize) + `"}`,
		"task id too long": `{"task_id":"` + strings.Repeat("x", snapshot.MaxIDLen+1) + `","tenant_id":"t","version":1}`,
	} {
		if s, err := snapshot.Parse([]byte(in)); err == nil {
			t.Errorf("%s: Parse = %+v, want an error", name, s)
		}
	}
	_, err := snapshot.Parse([]byte(`{"task_id":"a b","tenant_id":"t","version":1}`))
	if !errors.Is(err, snapshot.ErrInvalidID) {
		t.Errorf("bad task id: %v, want ErrInvalidID", err)
	}
	var s snapshot.Snapshot
	if err := json.Unmarshal([]byte(`{"task_id":"a","tenant_id":"t","version":0}`), &s); err == nil {
		t.Error("UnmarshalJSON accepted version 0")
	}
	if err := json.Unmarshal([]byte(`{"task_id":"a","tenant_id":"t","version":7}`), &s); err != nil || s.Version != 7 {
		t.Errorf("UnmarshalJSON = %+v, %v", &s, err)
	}
}

func TestVersionAndTTLRules(t *testing.T) {
	t.Parallel()
	s := snapshottest.Snapshot(t, "a", "t1", "SUCCEEDED", 5)
	if s.NewerThan(5) || !s.NewerThan(4) || !s.Terminal() {
		t.Error("NewerThan or Terminal wrong")
	}
	for range 1000 {
		for _, status := range []string{"QUEUED", "RUNNING", "SUCCEEDED", "FAILED"} {
			base := snapshot.TTL(status)
			if got := snapshot.TTLWithJitter(status); got < base || got > base+base/10 {
				t.Fatalf("TTLWithJitter(%s) = %v, want within [%v, %v]", status, got, base, base+base/10)
			}
		}
	}
}
