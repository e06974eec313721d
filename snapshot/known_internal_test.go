package snapshot

import (
	"errors"
	"testing"

	jsonv2 "github.com/go-json-experiment/json"
)

// FuzzDecodeKnown holds the reading of the known members to what JSON v2
// makes of them through reflection, which it replaced: the same documents
// accepted and the same values read. (A document that is not an object,
// or nests past MaxDepth, is refused only here.)
func FuzzDecodeKnown(f *testing.F) {
	for _, seed := range []string{
		`{"task_id":"task_123","tenant_id":"t1","project_id":"p1","user_id":"u1","status":"RUNNING","progress":45,"version":18,"updated_at":1710000000000}`,
		`{"task_id":null,"tenant_id":"t","version":null,"updated_at":null,"status":null}`,
		`{"task_\u0069d":"a\u00e9\n","tenant_id":"t","version":1}`,
		`{"task_id":"a","version":-0}`,
		`{"task_id":"a","version":1.0}`,
		`{"task_id":"a","version":1e3}`,
		`{"task_id":"a","version":9223372036854775807}`,
		`{"task_id":"a","version":9223372036854775808}`,
		`{"task_id":"a","version":-9223372036854775808}`,
		`{"task_id":"a","updated_at":"1"}`,
		`{"task_id":1,"version":1}`,
		`{"task_id":"a","task_id":"b"}`,
		`{"TASK_ID":"a","version":1}`,
		`{"task_id":"a","x":[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]}`,
		`{"task_id":"` + "\xff" + `"}`,
		`{}`, `[]`, `null`, `{"task_id":"a"`, ``,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var want struct {
			TaskID    string `json:"task_id"`
			TenantID  string `json:"tenant_id"`
			ProjectID string `json:"project_id"`
			UserID    string `json:"user_id"`
			Status    string `json:"status"`
			Version   *int64 `json:"version"`
			UpdatedAt int64  `json:"updated_at"`
		}
		wantErr := jsonv2.Unmarshal(b, &want)
		got, err := decodeKnown(b)
		switch {
		case errors.Is(err, errTooDeep) || errors.Is(err, errNotObject):
			return
		case (err == nil) != (wantErr == nil):
			t.Fatalf("%q: decodeKnown's error %v, JSON v2's %v", b, err, wantErr)
		case err != nil:
			return
		}
		if got.TaskID != want.TaskID || got.TenantID != want.TenantID || got.ProjectID != want.ProjectID ||
			got.UserID != want.UserID || got.Status != want.Status || got.UpdatedAt != want.UpdatedAt ||
			got.HasVersion != (want.Version != nil) || (want.Version != nil && got.Version != *want.Version) {
			t.Fatalf("%q: decodeKnown read %+v, JSON v2 %+v", b, got, want)
		}
	})
}
