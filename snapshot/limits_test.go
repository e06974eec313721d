package snapshot_test

import (
	"strconv"
	"strings"
	"testing"

	"github.com/pushd/pushd/snapshot"
	"github.com/pushd/pushd/snapshot/snapshottest"
)

// Parse accepts MaxDepth levels (the document's own object is the first)
// and refuses one more, naming the limit: Redis's Lua cannot decode a
// document nested 1,000 levels, so one could never be compared again.
func TestParseRefusesDeepDocuments(t *testing.T) {
	t.Parallel()
	if _, err := snapshot.Parse(snapshottest.DeepDoc("a", "t1", 1, snapshot.MaxDepth-1)); err != nil {
		t.Fatalf("Parse of %d levels: %v", snapshot.MaxDepth, err)
	}
	objects := `{"task_id":"a","tenant_id":"t1","version":1,"x":` +
		strings.Repeat(`{"y":`, snapshot.MaxDepth) + `1` + strings.Repeat(`}`, snapshot.MaxDepth) + `}`
	for name, in := range map[string][]byte{
		"arrays, one level too many":  snapshottest.DeepDoc("a", "t1", 1, snapshot.MaxDepth),
		"objects, one level too many": []byte(objects),
		"1,000 levels":                snapshottest.DeepDoc("a", "t1", 1, 1000),
	} {
		_, err := snapshot.Parse(in)
		if err == nil || !strings.Contains(err.Error(), "deeper than "+strconv.Itoa(snapshot.MaxDepth)) {
			t.Errorf("%s: Parse = %v, want an error naming the limit of %d levels", name, err, snapshot.MaxDepth)
		}
	}
}

// Versions are at most 2^53-1, the integers doubles (Lua's numbers, and
// JavaScript's) hold exactly; Parse refuses larger ones and ones below 1.
func TestParseRefusesVersionsAbove2To53(t *testing.T) {
	t.Parallel()
	if snapshot.MaxVersion != 1<<53-1 {
		t.Fatalf("MaxVersion = %d, want 2^53-1", int64(snapshot.MaxVersion))
	}
	for _, v := range []int64{1, snapshot.MaxVersion} {
		if s, err := snapshot.Parse(snapshottest.Doc("a", "t1", "RUNNING", v)); err != nil || s.Version != v {
			t.Errorf("Parse of version %d = %v, %v", v, s, err)
		}
	}
	for _, v := range []int64{1 << 53, 1<<53 + 1, 1<<63 - 1} {
		_, err := snapshot.Parse(snapshottest.Doc("a", "t1", "RUNNING", v))
		if err == nil || !strings.Contains(err.Error(), strconv.FormatInt(snapshot.MaxVersion, 10)) {
			t.Errorf("Parse of version %d = %v, want an error naming %d", v, err, int64(snapshot.MaxVersion))
		}
	}
	for _, v := range []int64{0, -1} {
		if _, err := snapshot.Parse(snapshottest.Doc("a", "t1", "RUNNING", v)); err == nil {
			t.Errorf("Parse of version %d succeeded", v)
		}
	}
}
