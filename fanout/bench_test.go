package fanout_test

import (
	"encoding/json"
	"testing"

	"github.com/pushd/pushd/fanout"
	"github.com/pushd/pushd/snapshot"
)

// BenchmarkParseNotification is the parse of one hint, which a node does
// for every notification it hears, watched or not.
func BenchmarkParseNotification(b *testing.B) {
	s, err := snapshot.Parse([]byte(`{"task_id":"task_123","tenant_id":"t1","project_id":"p1","user_id":"u1","status":"RUNNING","version":18,"updated_at":1710000000000}`))
	if err != nil {
		b.Fatal(err)
	}
	payload, err := json.Marshal(snapshot.NotificationFor(s))
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := fanout.ParseNotification("t1", payload); err != nil {
			b.Fatal(err)
		}
	}
}
