package snapshot_test

import (
	"errors"
	"fmt"

	"github.com/pushd/pushd/snapshot"
)

// Parse checks a snapshot document as a Task State Service writes it and
// keeps the document as it came, compacted; fields pushd does not know are
// passed to clients untouched.
func ExampleParse() {
	s, err := snapshot.Parse([]byte(`{
		"task_id": "task_123", "tenant_id": "t1", "project_id": "p1", "user_id": "u1",
		"status": "RUNNING", "progress": 45, "version": 18, "updated_at": 1710000000000,
		"preview_url": "/previews/task_123.png"}`))
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(s.TaskID, s.TenantID, s.Status, s.Version, s.Terminal())
	fmt.Println(string(s.JSON()))

	_, err = snapshot.Parse([]byte(`{"task_id":"task 123","tenant_id":"t1","version":1}`))
	fmt.Println(err, errors.Is(err, snapshot.ErrInvalidID))
	// Output:
	// task_123 t1 RUNNING 18 false
	// {"task_id":"task_123","tenant_id":"t1","project_id":"p1","user_id":"u1","status":"RUNNING","progress":45,"version":18,"updated_at":1710000000000,"preview_url":"/previews/task_123.png"}
	// snapshot: task_id: invalid id true
}
