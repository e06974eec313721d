package snapshot_test

import (
	"fmt"
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

// loadtestDoc is a snapshot shaped as the loadtest's (about 440 bytes),
// at version v: a progress tick changes progress, stage, version,
// updated_at, sent_ns and eta_ms.
func loadtestDoc(v int) []byte {
	return fmt.Appendf(nil, `{"task_id":"lt_000123","tenant_id":"t3","project_id":"p3_12","user_id":"u3_45","status":"RUNNING","progress":%d,"stage":"stage_%d","provider":"veo","model":"veo-3","queue_position":null,"preview_asset_id":null,"output_asset_id":null,"error_code":null,"version":%d,"updated_at":%d,"sent_ns":%d,"attempt":1,"eta_ms":%d,"region":"us-east1","worker_pool":"gpu-h100-pool-3","duration_s":8,"resolution":"1080p","pad":"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"}`,
		v%100, v%5, v, 1765000000000+int64(v)*1000, 1765000000000000000+int64(v)*1000000000, (100-v%100)*900)
}

// BenchmarkPatchFrom is the making of one version's patch, which a node
// does once per version and base however many connections it goes to.
func BenchmarkPatchFrom(b *testing.B) {
	base, err := snapshot.Parse(loadtestDoc(17))
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	next := loadtestDoc(18)
	for b.Loop() {
		b.StopTimer()
		s, err := snapshot.Parse(next) // a new snapshot: PatchFrom caches per snapshot
		if err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		if s.PatchFrom(base) == nil {
			b.Fatal("no patch")
		}
	}
}
