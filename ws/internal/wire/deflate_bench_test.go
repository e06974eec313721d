package wire

import "testing"

// BenchmarkDeflate compresses a running task's message of 353 bytes, as a
// version is compressed once for every connection that takes it.
func BenchmarkDeflate(b *testing.B) {
	msg := []byte(`{"type":"task","task":{"task_id":"task_01J9Z8Q3K4M5N6P7R8S9T0V1W2","tenant_id":"tenant_acme","project_id":"proj_marketing","user_id":"user_42","status":"RUNNING","progress":45,"stage":"provider_generating","provider":"veo","model":"veo-3","queue_position":0,"version":18,"updated_at":1710000000000,"created_at":1709999990000,"error":null,"output":null}}`)
	b.ReportAllocs()
	var n int
	for b.Loop() {
		n = len(Deflate(msg))
	}
	b.ReportMetric(float64(n), "B/msg")
}
