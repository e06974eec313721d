package snapshot

import (
	"bytes"
	"maps"
	"slices"
	"strconv"
	"sync/atomic"

	"github.com/go-json-experiment/json/jsontext"
)

// DeltasMerge is the value of the deltas request parameter with which a
// client asks for merge patches (Patch) instead of whole snapshots where
// it holds the version a patch applies to.
const DeltasMerge = "merge"

// Patch is a JSON merge patch (RFC 7386) that turns one version of a
// task's document, Base, into a later one: what a client that holds Base
// is sent instead of the whole document. A progress tick changes two or
// three fields of a document of several hundred bytes.
type Patch struct {
	TaskID  string
	Base    int64 // the version the patch applies to
	Version int64 // the version it makes
	// Event is {"task_id":..,"base":..,"patch":{..}}: the version it
	// makes is the patch's own "version" member, which every patch has
	// (versions only go up).
	Event []byte

	encoded [maxPatchEncodings]atomic.Pointer[[]byte]
}

// Slots of Patch.Encoded, one per wire format that wraps a patch event.
const (
	PatchEncodingWebSocket = iota // {"type":"patch",<Event's members>}
	maxPatchEncodings
)

// Encoded is Snapshot.Encoded for a patch: encode(p), once per patch and
// slot, then shared.
func (p *Patch) Encoded(slot int, encode func(*Patch) []byte) []byte {
	if e := p.encoded[slot].Load(); e != nil {
		return *e
	}
	b := encode(p)
	if p.encoded[slot].CompareAndSwap(nil, &b) {
		return b
	}
	return *p.encoded[slot].Load()
}

// patchFrom is the patch a snapshot caches: the one from its last base
// asked for. none says no patch serves that base (the documents differ in
// a way a merge patch cannot say, or the patch is no smaller).
type patchFrom struct {
	base  int64
	patch *Patch
}

// PatchFrom returns the merge patch from base, an earlier version of the
// same task, to s, or nil when the whole document should be sent instead:
// no base, another task, not older, a change a merge patch cannot carry
// (a null the patch would have to write, which a merge patch reads as a
// removal), or a patch no smaller than the document. It is computed once
// per snapshot and base version, then shared; versions name one document
// each, so any copy of the base version gives the same patch.
func (s *Snapshot) PatchFrom(base *Snapshot) *Patch {
	if base == nil || base.TaskID != s.TaskID || !s.NewerThan(base.Version) {
		return nil
	}
	if p := s.patch.Load(); p != nil && p.base == base.Version {
		return p.patch
	}
	p := &patchFrom{base: base.Version}
	if diff, ok := MergePatch(base.raw, s.raw); ok {
		ev := make([]byte, 0, len(diff)+len(s.TaskID)+64)
		ev = append(ev, `{"task_id":`...)
		ev, _ = jsontext.AppendQuote(ev, s.TaskID)
		ev = append(ev, `,"base":`...)
		ev = strconv.AppendInt(ev, base.Version, 10)
		ev = append(ev, `,"patch":`...)
		ev = append(ev, diff...)
		ev = append(ev, '}')
		if len(ev) < len(s.raw) {
			p.patch = &Patch{TaskID: s.TaskID, Base: base.Version, Version: s.Version, Event: ev}
		}
	}
	s.patch.Store(p)
	return p.patch
}

// MergePatch returns the JSON merge patch (RFC 7386) that turns the object
// from into the object to, and whether there is one. Members are compared
// as they are written, so a value spelled differently counts as changed
// and is sent whole; nested objects are patched member by member; numbers
// and strings are copied byte for byte, so no integer loses digits on the
// way. There is none when either is not an object, or when to holds a
// null where the patch would have to write it: a merge patch reads null
// as "remove".
func MergePatch(from, to []byte) ([]byte, bool) {
	out, ok := appendObjectPatch(nil, from, to)
	return out, ok
}

// appendObjectPatch appends the patch from object a to object b.
func appendObjectPatch(out, a, b []byte) ([]byte, bool) {
	am, ok := members(a)
	if !ok {
		return nil, false
	}
	dec := jsontext.NewDecoder(bytes.NewReader(b))
	if tok, err := dec.ReadToken(); err != nil || tok.Kind() != '{' {
		return nil, false
	}
	out = append(out, '{')
	first := true
	sep := func() {
		if !first {
			out = append(out, ',')
		}
		first = false
	}
	for dec.PeekKind() != '}' {
		v, err := dec.ReadValue()
		if err != nil {
			return nil, false
		}
		quoted := bytes.Clone(v) // v holds only until the next read
		name, ok := unquote(quoted)
		if !ok {
			return nil, false
		}
		bv, err := dec.ReadValue()
		if err != nil {
			return nil, false
		}
		av, had := am[name]
		delete(am, name)
		switch {
		case had && bytes.Equal(av, bv):
			continue
		case had && av.Kind() == '{' && bv.Kind() == '{':
			mark, wasFirst := len(out), first
			sep()
			out = append(out, quoted...)
			out = append(out, ':')
			nested := len(out)
			if out, ok = appendObjectPatch(out, av, bv); !ok {
				return nil, false
			}
			if string(out[nested:]) == "{}" { // the same members, spelled differently
				out, first = out[:mark], wasFirst
			}
		default:
			if hasNull(bv) {
				return nil, false
			}
			sep()
			out = append(out, quoted...)
			out = append(out, ':')
			out = append(out, bv...)
		}
	}
	// What a lacks of b's names is written; what b lacks of a's is removed.
	for _, name := range slices.Sorted(maps.Keys(am)) {
		sep()
		out, _ = jsontext.AppendQuote(out, name) // it was unquoted from valid JSON
		out = append(out, ":null"...)
	}
	return append(out, '}'), true
}

// members maps an object's member names (unquoted) to their values.
func members(obj []byte) (map[string]jsontext.Value, bool) {
	dec := jsontext.NewDecoder(bytes.NewReader(obj))
	if tok, err := dec.ReadToken(); err != nil || tok.Kind() != '{' {
		return nil, false
	}
	m := map[string]jsontext.Value{}
	for dec.PeekKind() != '}' {
		rawName, err := dec.ReadValue()
		if err != nil {
			return nil, false
		}
		name, ok := unquote(rawName)
		if !ok {
			return nil, false
		}
		v, err := dec.ReadValue()
		if err != nil {
			return nil, false
		}
		m[name] = bytes.Clone(v)
	}
	return m, true
}

func unquote(raw []byte) (string, bool) {
	if bytes.IndexByte(raw, '\\') < 0 {
		return string(raw[1 : len(raw)-1]), true
	}
	u, err := jsontext.AppendUnquote(nil, raw)
	return string(u), err == nil
}

// hasNull reports whether v holds a null a merge patch would read as a
// removal: v itself, or a member of an object within it outside arrays
// (an array is set whole, nulls and all).
func hasNull(v jsontext.Value) bool {
	switch v.Kind() {
	case 'n':
		return true
	case '{':
	default:
		return false
	}
	dec := jsontext.NewDecoder(bytes.NewReader(v))
	depthInArray := 0
	for {
		tok, err := dec.ReadToken()
		if err != nil {
			return false // v was read whole already: the end
		}
		switch tok.Kind() {
		case '[':
			depthInArray++
		case ']':
			depthInArray--
		case 'n':
			if depthInArray == 0 {
				return true
			}
		}
	}
}
