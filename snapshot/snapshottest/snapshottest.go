// Package snapshottest makes snapshot documents and parsed snapshots for tests.
package snapshottest

import (
	"fmt"
	"strings"
	"testing"

	"github.com/pushd/pushd/snapshot"
)

// Doc is a snapshot document of the given task, tenant, status and version.
func Doc(task, tenant, status string, version int64) []byte {
	return fmt.Appendf(nil, `{"task_id":%q,"tenant_id":%q,"project_id":"p1","user_id":"u1",`+
		`"status":%q,"progress":45,"version":%d,"updated_at":1710000000000}`,
		task, tenant, status, version)
}

// DeepDoc is a snapshot document whose field "x" nests depth arrays.
func DeepDoc(task, tenant string, version int64, depth int) []byte {
	return fmt.Appendf(nil, `{"task_id":%q,"tenant_id":%q,"status":"RUNNING","version":%d,"x":%s%s}`,
		task, tenant, version, strings.Repeat("[", depth), strings.Repeat("]", depth))
}

// MustParse parses a snapshot document or fails the test.
func MustParse(t testing.TB, b []byte) *snapshot.Snapshot {
	t.Helper()
	s, err := snapshot.Parse(b)
	if err != nil {
		t.Fatalf("Parse(%s): %v", b, err)
	}
	return s
}

// Snapshot is the parsed Doc.
func Snapshot(t testing.TB, task, tenant, status string, version int64) *snapshot.Snapshot {
	t.Helper()
	return MustParse(t, Doc(task, tenant, status, version))
}
