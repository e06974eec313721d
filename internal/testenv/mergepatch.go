package testenv

import (
	"bytes"
	"encoding/json"
	"testing"
)

// ApplyMergePatch is RFC 7386's MergePatch(target, patch), as a client
// applies a patch event: the oracle that pushd's patches are checked
// against.
func ApplyMergePatch(target, patch any) any {
	pm, ok := patch.(map[string]any)
	if !ok {
		return patch
	}
	tm := map[string]any{}
	if t, ok := target.(map[string]any); ok {
		for k, v := range t {
			tm[k] = v
		}
	}
	for k, v := range pm {
		if v == nil {
			delete(tm, k)
		} else {
			tm[k] = ApplyMergePatch(tm[k], v)
		}
	}
	return tm
}

// DecodeJSON reads a JSON document as a browser would, numbers kept as
// written (json.Number), for comparing documents.
func DecodeJSON(t testing.TB, b []byte) any {
	t.Helper()
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		t.Fatalf("decode %s: %v", b, err)
	}
	return v
}
