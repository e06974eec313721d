package snapshot_test

import (
	"encoding/json"
	"reflect"
	"testing"

	"github.com/pushd/pushd/internal/testenv"
	"github.com/pushd/pushd/snapshot"
	"github.com/pushd/pushd/snapshot/snapshottest"
)

// checkPatch checks that patch turns from into to.
func checkPatch(t *testing.T, from, to, patch []byte) {
	t.Helper()
	got := testenv.ApplyMergePatch(testenv.DecodeJSON(t, from), testenv.DecodeJSON(t, patch))
	if want := testenv.DecodeJSON(t, to); !reflect.DeepEqual(got, want) {
		t.Fatalf("the patch %s turns\n%s\ninto %v, want\n%s", patch, from, got, to)
	}
}

func TestMergePatch(t *testing.T) {
	const tick = `{"task_id":"task_123","tenant_id":"t1","project_id":"p1","status":"RUNNING","progress":45,"stage":"provider_generating","output_asset_id":null,"error_code":null,"version":18,"updated_at":1710000000000,"sent_ns":1765000000123456789}`
	for _, c := range []struct {
		name, from, to, want string
		ok                   bool
	}{
		{"a progress tick", tick,
			`{"task_id":"task_123","tenant_id":"t1","project_id":"p1","status":"RUNNING","progress":46,"stage":"provider_generating","output_asset_id":null,"error_code":null,"version":19,"updated_at":1710000000500,"sent_ns":1765000000623456789}`,
			`{"progress":46,"version":19,"updated_at":1710000000500,"sent_ns":1765000000623456789}`, true},
		{"a finished task: null to a value, a field gone, one new",
			tick,
			`{"task_id":"task_123","tenant_id":"t1","project_id":"p1","status":"SUCCEEDED","progress":100,"output_asset_id":"asset_9","error_code":null,"version":19,"updated_at":1710000001000,"sent_ns":1765000000123456789,"output":{"url":"https://cdn/x.mp4","seconds":8}}`,
			`{"status":"SUCCEEDED","progress":100,"output_asset_id":"asset_9","version":19,"updated_at":1710000001000,"output":{"url":"https://cdn/x.mp4","seconds":8},"stage":null}`, true},
		{"nested objects patched member by member",
			`{"a":{"x":1,"y":{"p":1,"q":2},"z":3},"v":1}`,
			`{"a":{"x":1,"y":{"p":1,"q":3}},"v":2}`,
			`{"a":{"y":{"q":3},"z":null},"v":2}`, true},
		{"an object spelled differently, the same members",
			`{"a":{"x":1, "y":2},"v":1}`, `{"a":{"y":2,"x":1},"v":2}`, `{"v":2}`, true},
		{"arrays are set whole, nulls and all",
			`{"a":[1,2],"v":1}`, `{"a":[1,null,{"b":null}],"v":2}`, `{"a":[1,null,{"b":null}],"v":2}`, true},
		{"nothing changed", `{"v":1}`, `{"v":1}`, `{}`, true},
		{"a value that becomes null cannot be said", `{"a":1,"v":1}`, `{"a":null,"v":2}`, ``, false},
		{"a new object holding a null cannot be said", `{"v":1}`, `{"a":{"b":null},"v":2}`, ``, false},
		{"not an object", `[1]`, `{"v":1}`, ``, false},
		{"duplicate names", `{"v":1}`, `{"v":1,"v":2}`, ``, false},
		{"an escaped name matches its unescaped spelling", `{"\u0061":1,"b":1}`, `{"a":1,"b":2}`, `{"b":2}`, true},
		{"escaped names, written as they were", `{"a\"b":1,"\u00e9":2}`, `{"a\"b":2}`, `{"a\"b":2,"\u00e9":null}`, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, ok := snapshot.MergePatch([]byte(c.from), []byte(c.to))
			if ok != c.ok {
				t.Fatalf("ok %v, want %v (patch %s)", ok, c.ok, got)
			}
			if !ok {
				return
			}
			if string(got) != c.want {
				t.Errorf("patch %s, want %s", got, c.want)
			}
			checkPatch(t, []byte(c.from), []byte(c.to), got)
		})
	}
}

// FuzzMergePatch: a patch MergePatch makes turns its from into its to, as
// RFC 7386 applies it, numbers exactly as written.
func FuzzMergePatch(f *testing.F) {
	for _, seed := range [][2]string{
		{`{"a":1,"b":{"c":[1,2],"d":"x"}}`, `{"a":2,"b":{"c":[1],"e":true}}`},
		{`{"a":{"b":{"c":1}}}`, `{"a":{"b":{"c":1,"d":null}}}`},
		{`{"n":12345678901234567890}`, `{"n":12345678901234567891}`},
		{`{"a":1}`, `{"a":{"x":[null]}}`},
	} {
		f.Add([]byte(seed[0]), []byte(seed[1]))
	}
	f.Fuzz(func(t *testing.T, from, to []byte) {
		patch, ok := snapshot.MergePatch(from, to)
		if !ok {
			return
		}
		if !json.Valid(patch) {
			t.Fatalf("the patch %q is not JSON", patch)
		}
		checkPatch(t, from, to, patch)
	})
}

// A snapshot's patch from the version before is made once and shared;
// none is made from a newer base, another task's, or when the patch
// would be no smaller than the document.
func TestPatchFrom(t *testing.T) {
	v1 := snapshottest.MustParse(t, []byte(`{"task_id":"a","tenant_id":"t","status":"RUNNING","progress":1,"detail":"a long description of the task that does not change","version":1}`))
	v2 := snapshottest.MustParse(t, []byte(`{"task_id":"a","tenant_id":"t","status":"RUNNING","progress":2,"detail":"a long description of the task that does not change","version":2}`))
	other := snapshottest.MustParse(t, []byte(`{"task_id":"b","tenant_id":"t","version":1}`))
	p := v2.PatchFrom(v1)
	if p == nil {
		t.Fatal("no patch from the version before")
	}
	if want := `{"task_id":"a","base":1,"patch":{"progress":2,"version":2}}`; string(p.Event) != want {
		t.Fatalf("event %s, want %s", p.Event, want)
	}
	if p.Base != 1 || p.Version != 2 || p.TaskID != "a" {
		t.Fatalf("patch %+v", p)
	}
	if again := v2.PatchFrom(snapshottest.MustParse(t, v1.JSON())); again != p {
		t.Error("a second copy of the same base version made the patch again")
	}
	for name, base := range map[string]*snapshot.Snapshot{"nil": nil, "newer": v2, "another task's": other} {
		if p := v1.PatchFrom(base); p != nil {
			t.Errorf("a patch from a %s base: %s", name, p.Event)
		}
	}
	small1 := snapshottest.MustParse(t, []byte(`{"task_id":"c","tenant_id":"t","version":1}`))
	small2 := snapshottest.MustParse(t, []byte(`{"task_id":"c","tenant_id":"t","version":2}`))
	if p := small2.PatchFrom(small1); p != nil {
		t.Errorf("a patch %s no smaller than the document %s", p.Event, small2.JSON())
	}
}
