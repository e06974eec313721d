package fanout_test

import (
	"testing"

	"github.com/pushd/pushd/fanout"
	"github.com/pushd/pushd/snapshot"
)

// FuzzParseNotification feeds what anyone who can PUBLISH on a tenant's
// channel may send. An accepted notification names a valid task and a
// positive version, and its tenant is the channel's, whatever the payload
// says.
func FuzzParseNotification(f *testing.F) {
	for _, seed := range []string{
		`{"task_id":"task_123","version":18,"status":"RUNNING"}`,
		`{"task_id":"task_123","version":18,"tenant_id":"t2","project_id":"p1","user_id":"u1","occurred_at":1710000000000}`,
		`{"task_id":"task_123","version":-1}`,
		`{"task_id":"","version":1}`,
		`{"task_id":"a b","version":1}`,
		`{"task_id":"a","version":"1"}`,
		`{"task_id":"a","version":1,"project_id":"../x"}`,
		`garbage`, `{}`, `[]`,
	} {
		f.Add("t1", []byte(seed))
	}
	f.Fuzz(func(t *testing.T, tenant string, payload []byte) {
		n, err := fanout.ParseNotification(tenant, payload)
		if err != nil {
			return
		}
		if n.TenantID != tenant {
			t.Fatalf("notification heard on tenant %q's channel names tenant %q", tenant, n.TenantID)
		}
		if !snapshot.ValidID(n.TaskID) || n.Version <= 0 {
			t.Fatalf("accepted %+v", n)
		}
		if (n.ProjectID != "" && !snapshot.ValidID(n.ProjectID)) || (n.UserID != "" && !snapshot.ValidID(n.UserID)) {
			t.Fatalf("accepted invalid ids: %+v", n)
		}
	})
}
