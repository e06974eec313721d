package snapshot

import (
	"bytes"
	"slices"
	"strconv"
	"sync"
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
	PatchEncodingWebSocket        = iota // {"type":"patch",<Event's members>}
	PatchEncodingWebSocketDeflate        // the same, compressed for permessage-deflate
	maxPatchEncodings
)

// Encoded is Snapshot.Encoded for a patch: encode(p), once per patch and
// slot, then shared.
func (p *Patch) Encoded(slot int, encode func(*Patch) []byte) []byte {
	return encodeOnce(&p.encoded[slot], p, encode)
}

// patchFrom is the patch a snapshot caches: the one from the last base
// version asked for, made once (the writers of the connections a version
// goes to ask at about the same moment). patch stays nil when no patch
// serves that base: the documents differ in a way a merge patch cannot
// say, or the patch is no smaller.
type patchFrom struct {
	base  int64
	once  sync.Once
	patch *Patch
}

// PatchFrom returns the merge patch from base, an earlier version of the
// same task, to s, or nil when the whole document should be sent instead:
// no base, another task, not older, a change a merge patch cannot carry
// (a null the patch would have to write, which a merge patch reads as a
// removal), or a patch no smaller than the document. It is made once per
// snapshot and base version, then shared; versions name one document
// each, so any copy of the base version gives the same patch.
func (s *Snapshot) PatchFrom(base *Snapshot) *Patch {
	if base == nil || base.TaskID != s.TaskID || !s.NewerThan(base.Version) {
		return nil
	}
	p := s.patch.Load()
	if p == nil || p.base != base.Version {
		// A connection that holds another version than the last asker's
		// (it missed a version, or another's grant let one through) gets
		// its own; the cache keeps the latest base asked for.
		next := &patchFrom{base: base.Version}
		s.patch.Store(next)
		p = next
	}
	p.once.Do(func() { p.patch = makePatch(base, s) })
	return p.patch
}

// makePatch is the patch event from base to s, or nil.
func makePatch(base, s *Snapshot) *Patch {
	diff, ok := MergePatch(base.raw, s.raw)
	if !ok {
		return nil
	}
	ev := make([]byte, 0, len(diff)+len(s.TaskID)+64)
	ev = append(ev, `{"task_id":`...)
	ev, _ = jsontext.AppendQuote(ev, s.TaskID)
	ev = append(ev, `,"base":`...)
	ev = strconv.AppendInt(ev, base.Version, 10)
	ev = append(ev, `,"patch":`...)
	ev = append(ev, diff...)
	ev = append(ev, '}')
	if len(ev) >= len(s.raw) {
		return nil
	}
	return &Patch{TaskID: s.TaskID, Base: base.Version, Version: s.Version, Event: ev}
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
	return appendObjectPatch(nil, from, to)
}

// member is one member of an object: its name as written, the name's
// key (unquoted, or the same bytes when it has no escape) and its value,
// all slices of the object's own bytes.
type member struct {
	quoted, key, value []byte
}

// objectReader reads an object's members; pooled, as a patch is made of
// two objects and each nested pair.
type objectReader struct {
	r       bytes.Reader
	dec     jsontext.Decoder
	members []member
}

var objectReaders = sync.Pool{New: func() any { return new(objectReader) }}

// read lists obj's members; the list is valid until the reader is put
// back.
func (o *objectReader) read(obj []byte) bool {
	o.r.Reset(obj)
	o.dec.Reset(&o.r)
	o.members = o.members[:0]
	if tok, err := o.dec.ReadToken(); err != nil || tok.Kind() != '{' {
		return false
	}
	// A value read is the input's bytes up to the offset after it.
	slice := func(v jsontext.Value) []byte {
		end := int(o.dec.InputOffset())
		return obj[end-len(v) : end : end]
	}
	for o.dec.PeekKind() != '}' {
		name, err := o.dec.ReadValue()
		if err != nil {
			return false
		}
		quoted := slice(name)
		key := quoted[1 : len(quoted)-1]
		if bytes.IndexByte(key, '\\') >= 0 {
			if key, err = jsontext.AppendUnquote(nil, quoted); err != nil {
				return false
			}
		}
		v, err := o.dec.ReadValue()
		if err != nil {
			return false
		}
		o.members = append(o.members, member{quoted: quoted, key: key, value: slice(v)})
	}
	_, err := o.dec.ReadToken()
	return err == nil
}

// appendObjectPatch appends the patch from object a to object b.
func appendObjectPatch(out, a, b []byte) ([]byte, bool) {
	ar, br := objectReaders.Get().(*objectReader), objectReaders.Get().(*objectReader)
	defer objectReaders.Put(ar)
	defer objectReaders.Put(br)
	if !ar.read(a) || !br.read(b) {
		return nil, false
	}
	matched := make([]bool, len(ar.members)) // a's members b has too
	out = append(out, '{')
	first := true
	sep := func() {
		if !first {
			out = append(out, ',')
		}
		first = false
	}
	for _, bm := range br.members {
		i := slices.IndexFunc(ar.members, func(am member) bool { return bytes.Equal(am.key, bm.key) })
		var av jsontext.Value
		if i >= 0 {
			matched[i], av = true, ar.members[i].value
		}
		bv := jsontext.Value(bm.value)
		switch {
		case i >= 0 && bytes.Equal(av, bv):
			continue
		case i >= 0 && av.Kind() == '{' && bv.Kind() == '{':
			mark, wasFirst := len(out), first
			sep()
			out = append(out, bm.quoted...)
			out = append(out, ':')
			nested := len(out)
			var ok bool
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
			out = append(out, bm.quoted...)
			out = append(out, ':')
			out = append(out, bv...)
		}
	}
	// What b lacks of a's members is removed.
	for i, am := range ar.members {
		if !matched[i] {
			sep()
			out = append(out, am.quoted...)
			out = append(out, ":null"...)
		}
	}
	return append(out, '}'), true
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
