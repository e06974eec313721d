package snapshot_test

import (
	"bytes"
	"encoding/json"
	"testing"

	"github.com/pushd/pushd/snapshot"
)

// FuzzParse feeds Parse what Redis, PostgreSQL or POST /v1/publish may hold.
// A document it accepts must be one SSE data line of valid JSON that parses
// again to the same task, tenant and version: what pushd routes by is what
// it forwards.
func FuzzParse(f *testing.F) {
	for _, seed := range []string{
		`{"task_id":"task_123","tenant_id":"t1","project_id":"p1","user_id":"u1","status":"RUNNING","progress":45,"stage":"provider_generating","provider":"veo","model":"veo-3","queue_position":12,"preview_asset_id":null,"output_asset_id":null,"error_code":null,"version":18,"updated_at":1710000000000}`,
		"{\n  \"task_id\": \"a\",\n  \"tenant_id\": \"t\",\n  \"version\": 1\n}",
		`{"task_id":"a","tenant_id":"t","version":0}`,
		`{"task_id":"a","tenant_id":"t","version":1.5}`,
		`{"task_id":"a","tenant_id":"t","version":9223372036854775807}`,
		`{"task_id":"a","tenant_id":"t","version":9007199254740992}`,
		`{"task_id":"a","tenant_id":"t","version":1,"x":[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]}`,
		`{"task\u005fid":"a","tenant_id":"t","version":1}`,
		`{"task_id":"a/../b","tenant_id":"t","version":1}`,
		`{"task_id":"a","tenant_id":"","version":1}`,
		`{"task_id":"a","tenant_id":"t","version":1,"x":{"nested":[1,2,{"y":"\u2028"}]}}`,
		`{"task_id":"a","tenant_id":"t","version":1}{"task_id":"b"}`,
		`{"task_id":"a","tenant_id":"t1","TENANT_ID":"t2","version":1}`,
		`{"task_id":"a","tenant_id":"t1","version":1,"tenant_id":"t2"}`,
		`[]`, `null`, `"x"`, ``,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		s, err := snapshot.Parse(b)
		if err != nil {
			return
		}
		raw := s.JSON()
		if bytes.ContainsAny(raw, "\r\n") {
			t.Fatalf("accepted document %q has a line break", raw)
		}
		if !json.Valid(raw) {
			t.Fatalf("accepted document %q is not valid JSON", raw)
		}
		if !snapshot.ValidID(s.TaskID) || !snapshot.ValidID(s.TenantID) || s.Version <= 0 || s.Version > snapshot.MaxVersion {
			t.Fatalf("accepted %+v", s)
		}
		// A browser reads the forwarded document with JSON.parse: exact
		// keys, the last of duplicates wins. It must see the tenant and
		// task pushd routed the snapshot by.
		var seen map[string]any
		if err := json.Unmarshal(raw, &seen); err != nil {
			t.Fatalf("accepted document %q is not an object: %v", raw, err)
		}
		if seen["tenant_id"] != s.TenantID || seen["task_id"] != s.TaskID {
			t.Fatalf("routed as %s/%s, but a browser reads tenant_id %v, task_id %v in %q",
				s.TenantID, s.TaskID, seen["tenant_id"], seen["task_id"], raw)
		}
		again, err := snapshot.Parse(raw)
		if err != nil {
			t.Fatalf("the forwarded form %q does not parse: %v", raw, err)
		}
		if again.TaskID != s.TaskID || again.TenantID != s.TenantID || again.Version != s.Version {
			t.Fatalf("forwarded form parses as %s/%s v%d, original as %s/%s v%d",
				again.TenantID, again.TaskID, again.Version, s.TenantID, s.TaskID, s.Version)
		}
	})
}
