package stream

import (
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/pushd/pushd/snapshot"
)

// FuzzParseEntry feeds stream entries as anyone who can XADD to a tenant's
// stream may write them. An accepted entry names a valid task and a
// positive version, its tenant is always the stream's, and ids it carries
// are valid or dropped.
func FuzzParseEntry(f *testing.F) {
	f.Add("task_123", "18", "p1", "u1", "1710000000000", "task.changed")
	f.Add("task_123", "-1", "", "", "", "")
	f.Add("a b", "1", "p/1", "u\n1", "x", "")
	f.Add("task_1", "9223372036854775808", "", "", "", "")
	f.Add("task_1", "1.5", "", "", "", "")
	f.Add("", "", "", "", "", "")
	f.Fuzz(func(t *testing.T, task, version, project, user, occurred, eventType string) {
		m := redis.XMessage{ID: "1-1", Values: map[string]any{
			"task_id": task, "version": version, "project_id": project, "user_id": user,
			"occurred_at": occurred, "event_type": eventType,
		}}
		n, ok := parseEntry("t1", m)
		if !ok {
			return
		}
		if n.TenantID != "t1" {
			t.Fatalf("entry of tenant t1's stream names tenant %q", n.TenantID)
		}
		if !snapshot.ValidID(n.TaskID) || n.Version <= 0 {
			t.Fatalf("accepted %+v", n)
		}
		if (n.ProjectID != "" && !snapshot.ValidID(n.ProjectID)) || (n.UserID != "" && !snapshot.ValidID(n.UserID)) {
			t.Fatalf("accepted invalid ids: %+v", n)
		}
	})
}
