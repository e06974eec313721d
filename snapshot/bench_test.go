package snapshot_test

import (
	"testing"

	"github.com/pushd/pushd/snapshot"
)

func BenchmarkParse(b *testing.B) {
	in := []byte(`{"task_id":"task_123","tenant_id":"t1","project_id":"p1","user_id":"u1",` +
		`"status":"RUNNING","progress":45,"stage":"provider_generating","provider":"veo","model":"veo-3",` +
		`"queue_position":12,"preview_asset_id":null,"output_asset_id":null,"error_code":null,` +
		`"version":18,"updated_at":1710000000000}`)
	b.ReportAllocs()
	b.SetBytes(int64(len(in)))
	for b.Loop() {
		if _, err := snapshot.Parse(in); err != nil {
			b.Fatal(err)
		}
	}
}
