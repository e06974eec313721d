// Package snapshot is the model every layer shares: the versioned task
// snapshot and its rules, the ids, the change notification, the errors, and
// the Source and Writer interfaces. It imports no driver, so the transports
// (sse, ws) and the hub can name a snapshot without linking Redis or
// PostgreSQL. The stores live elsewhere: MemoryStore here (the embedded
// mode), the Redis and PostgreSQL read store in snapshot/store, the Lua
// write protocol in snapshot/rediswrite.
//
// The contract of a snapshot document (Parse): a JSON object of at most
// MaxSize bytes, nested at most MaxDepth levels, with a valid task_id and
// tenant_id and an integer version from 1 to MaxVersion. Versions only go
// up, and a task belongs to one tenant: a write of another tenant's
// snapshot of a stored task is refused with ErrTenantMismatch. A stored
// document whose version or tenant the write script cannot read is never
// overwritten before it expires (ErrStoredUnreadable): letting any version
// in could let an older one in.
//
// It is part of the public API for Task State Services, with fanout and
// keys: a service builds and checks its documents with Parse before it
// publishes them.
package snapshot

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync/atomic"
	"time"

	jsonv2 "github.com/go-json-experiment/json"
	"github.com/go-json-experiment/json/jsontext"
)

// Errors callers branch on.
var (
	// ErrNotFound: no source has the task. Callers answer a task of another
	// tenant with the same error, so the two are indistinguishable.
	ErrNotFound = errors.New("task not found")
	// ErrInvalidID: an id failed ValidID; no I/O was done.
	ErrInvalidID = errors.New("invalid id")
	// ErrUnavailable: no source could answer (Redis and PostgreSQL both down,
	// or the PostgreSQL fallback is saturated).
	ErrUnavailable = errors.New("snapshot sources unavailable")
	// ErrTenantMismatch: a write was refused because the stored snapshot
	// of the task belongs to another tenant. Task ids are global, so
	// letting it in would move the task out of its owner's reach.
	ErrTenantMismatch = errors.New("the task belongs to another tenant")
	// ErrStoredUnreadable: a write was refused because the stored document
	// of the task is one whose version and tenant cannot be read (written
	// by hand, or by an older pushd). Nothing proves the new version is
	// newer, so nothing replaces it before it expires.
	ErrStoredUnreadable = errors.New("the stored snapshot cannot be read")
)

// Snapshot is one version of a task's state. It is immutable once parsed and
// shared by every connection that receives it. The fields below are the ones
// pushd routes and orders by; the document itself, unknown fields included,
// is kept verbatim in JSON() and forwarded as is, so the Task State Service
// can add fields without a pushd release.
type Snapshot struct {
	TaskID    string
	TenantID  string
	ProjectID string
	UserID    string
	Status    string
	Version   int64
	UpdatedAt int64 // Unix milliseconds
	// Origin is where this copy was read from, set by the store that read
	// it before anyone else sees it; the zero value, OriginMemory, is a
	// copy parsed in this process (a publish, the embedded store). For an
	// operator's inspection only: nothing routes by it.
	Origin Origin

	raw []byte

	encoded [maxEncodings]atomic.Pointer[[]byte] // see Encoded
	patch   atomic.Pointer[patchFrom]            // see PatchFrom
}

// Origin is where a snapshot was read from.
type Origin uint8

// Origins of a snapshot.
const (
	OriginMemory   Origin = iota // parsed in this process: a publish, the embedded store
	OriginRedis                  // read from Redis
	OriginPostgres               // read from PostgreSQL
)

// String names the origin as the admin API shows it.
func (o Origin) String() string {
	switch o {
	case OriginRedis:
		return "redis"
	case OriginPostgres:
		return "postgres"
	}
	return "memory"
}

// Slots of Encoded, one per wire format that wraps a whole snapshot.
const (
	EncodingWebSocket        = iota // {"type":"task","task":<document>}
	EncodingWebSocketDeflate        // the same, compressed for permessage-deflate
	maxEncodings
)

// Encoded returns encode(s), computed once per snapshot and slot and then
// shared: a version is encoded once however many connections receive it.
// Concurrent first calls may each encode; one result wins.
func (s *Snapshot) Encoded(slot int, encode func(*Snapshot) []byte) []byte {
	return encodeOnce(&s.encoded[slot], s, encode)
}

// encodeOnce returns encode(v), kept in at by the first call that stores
// it; concurrent first calls may each encode, and one result wins.
func encodeOnce[T any](at *atomic.Pointer[[]byte], v T, encode func(T) []byte) []byte {
	if p := at.Load(); p != nil {
		return *p
	}
	b := encode(v)
	if at.CompareAndSwap(nil, &b) {
		return b
	}
	return *at.Load()
}

// Bounds of a snapshot document.
const (
	// MaxSize bounds its length in bytes.
	MaxSize = 64 << 10
	// MaxDepth bounds its nesting: the document's own object is level 1,
	// so a field may hold 63 levels of objects and arrays. Redis's Lua
	// JSON decoder gives up at 1,000 levels; no task state needs more
	// than a few.
	MaxDepth = 64
	// MaxVersion is the largest version: 2^53-1, the largest integer a
	// double holds exactly. Browsers (JSON.parse) and Redis's Lua both
	// compare versions as doubles, so a larger one would compare wrongly.
	MaxVersion = 1<<53 - 1
)

// known is the part of the document pushd reads.
type known struct {
	TaskID, TenantID, ProjectID, UserID, Status string
	Version                                     int64
	HasVersion                                  bool // a version was given, not null
	UpdatedAt                                   int64
}

// The string members of known, as UnmarshalJSONFrom numbers them.
const (
	kTask = iota
	kTenant
	kProject
	kUser
	kStatus
	kStrings
)

// decodeKnown reads the known fields the way a browser's JSON.parse does
// (keys match exactly), and refuses what a browser would read differently
// from pushd: encoding/json matches struct fields case-insensitively and
// lets the last duplicate win, so a document with both "tenant_id":"t1"
// and "TENANT_ID":"t2" would be routed to tenant t2 while its readers see
// t1. JSON v2 matches names exactly and rejects duplicate names and
// invalid UTF-8.
func decodeKnown(b []byte) (known, error) {
	var k known
	err := jsonv2.Unmarshal(b, &k)
	return k, err
}

var (
	errNotObject = errors.New("not a JSON object")
	errTooDeep   = fmt.Errorf("nested deeper than %d levels", MaxDepth)
)

// UnmarshalJSONFrom reads the known fields with JSON v2's rules and skips
// the others, refusing them past MaxDepth, in one pass over the document.
func (k *known) UnmarshalJSONFrom(dec *jsontext.Decoder) error {
	tok, err := dec.ReadToken()
	if err != nil {
		return err
	}
	if tok.Kind() != '{' {
		return errNotObject
	}
	// The string members are unquoted into one buffer and made strings
	// together: one allocation, and a delivery's compares of a task's
	// tenant and ids read one cache line.
	var (
		unquoted []byte
		buf      [128]byte // typical ids and a status fit; longer ones grow it
		text     = buf[:0]
		spans    [kStrings][2]int
	)
	for dec.PeekKind() != '}' {
		name, err := dec.ReadValue() // the decoder checks syntax and duplicates
		if err != nil {
			return err
		}
		raw := name[1 : len(name)-1]
		if bytes.IndexByte(raw, '\\') >= 0 {
			if unquoted, err = jsontext.AppendUnquote(unquoted[:0], name); err != nil {
				return err
			}
			raw = unquoted
		}
		member := -1
		switch string(raw) {
		case "task_id":
			member = kTask
		case "tenant_id":
			member = kTenant
		case "project_id":
			member = kProject
		case "user_id":
			member = kUser
		case "status":
			member = kStatus
		case "version":
			var null bool
			k.Version, null, err = readInteger(dec)
			k.HasVersion = !null
		case "updated_at":
			k.UpdatedAt, _, err = readInteger(dec)
		default:
			err = skipShallow(dec)
		}
		if member >= 0 {
			start := len(text)
			text, err = appendString(dec, text)
			spans[member] = [2]int{start, len(text)}
		}
		if err != nil {
			return err
		}
	}
	all := string(text)
	for i, dst := range [kStrings]*string{&k.TaskID, &k.TenantID, &k.ProjectID, &k.UserID, &k.Status} {
		*dst = all[spans[i][0]:spans[i][1]]
	}
	_, err = dec.ReadToken()
	return err
}

// appendString and readInteger read the known members from the decoder's
// values as JSON v2 would unmarshal them into a Go string or int64 (null
// leaves the zero value), without its reflection: that was a third of a
// snapshot's parse, which a node does for every version it reads.
var (
	errNotString  = errors.New("want a string or null")
	errNotInteger = errors.New("want an integer or null")
)

// appendString appends the next value, a string, unquoted to dst; null
// appends nothing.
func appendString(dec *jsontext.Decoder, dst []byte) ([]byte, error) {
	val, err := dec.ReadValue()
	if err != nil {
		return dst, err
	}
	switch val.Kind() {
	case 'n':
		return dst, nil
	case '"':
		return jsontext.AppendUnquote(dst, val)
	}
	return dst, fieldError(dec, errNotString)
}

// readInteger reads an integer in int64's range, written without a
// fraction or an exponent, or null.
func readInteger(dec *jsontext.Decoder) (v int64, null bool, err error) {
	val, err := dec.ReadValue()
	if err != nil {
		return 0, false, err
	}
	switch val.Kind() {
	case 'n':
		return 0, true, nil
	case '0':
		if v, err = strconv.ParseInt(string(val), 10, 64); err == nil {
			return v, false, nil
		}
	}
	return 0, false, fieldError(dec, errNotInteger)
}

// fieldError names the member whose value was just read.
func fieldError(dec *jsontext.Decoder, err error) error {
	return fmt.Errorf("%s: %w", dec.StackPointer(), err)
}

// skipShallow skips the next value, failing once it nests past MaxDepth.
func skipShallow(dec *jsontext.Decoder) error {
	if k := dec.PeekKind(); k != '{' && k != '[' {
		return dec.SkipValue()
	}
	depth := dec.StackDepth()
	for {
		if _, err := dec.ReadToken(); err != nil {
			return err
		}
		if dec.StackDepth() > MaxDepth {
			return errTooDeep
		}
		if dec.StackDepth() == depth {
			return nil
		}
	}
}

// Parse validates a snapshot document and returns it. The document must be a
// JSON object of at most MaxSize bytes and MaxDepth levels, with a valid
// task_id and tenant_id and a version from 1 to MaxVersion.
func Parse(b []byte) (*Snapshot, error) {
	if len(b) > MaxSize {
		return nil, fmt.Errorf("snapshot: %d bytes exceeds %d", len(b), MaxSize)
	}
	k, err := decodeKnown(b)
	if errors.Is(err, errTooDeep) {
		return nil, fmt.Errorf("snapshot: %w", errTooDeep) // without the decoder's long JSON pointer
	}
	if err != nil {
		return nil, fmt.Errorf("snapshot: %w", err)
	}
	switch {
	case !ValidID(k.TaskID):
		return nil, fmt.Errorf("snapshot: task_id: %w", ErrInvalidID)
	case !ValidID(k.TenantID):
		return nil, fmt.Errorf("snapshot: tenant_id: %w", ErrInvalidID)
	case k.ProjectID != "" && !ValidID(k.ProjectID):
		return nil, fmt.Errorf("snapshot: project_id: %w", ErrInvalidID)
	case k.UserID != "" && !ValidID(k.UserID):
		return nil, fmt.Errorf("snapshot: user_id: %w", ErrInvalidID)
	case !k.HasVersion || k.Version <= 0:
		return nil, errors.New("snapshot: version must be a positive integer")
	case k.Version > MaxVersion:
		return nil, fmt.Errorf("snapshot: version %d exceeds %d (2^53-1), the largest integer browsers and Redis compare exactly", k.Version, MaxVersion)
	}
	var raw []byte
	if isCompact(b) {
		raw = bytes.Clone(b)
	} else {
		var buf bytes.Buffer
		if err := json.Compact(&buf, b); err != nil {
			return nil, fmt.Errorf("snapshot: %w", err)
		}
		raw = buf.Bytes()
	}
	return &Snapshot{
		TaskID: k.TaskID, TenantID: k.TenantID, ProjectID: k.ProjectID, UserID: k.UserID,
		Status: k.Status, Version: k.Version, UpdatedAt: k.UpdatedAt,
		raw: raw,
	}, nil
}

// isCompact reports whether b has no newlines, which SSE data lines cannot
// carry. Other whitespace is harmless and kept.
func isCompact(b []byte) bool { return bytes.IndexByte(b, '\n') < 0 && bytes.IndexByte(b, '\r') < 0 }

// JSON returns the document as written, compacted to one line. Callers must
// not modify it.
func (s *Snapshot) JSON() []byte { return s.raw }

// MarshalJSON forwards the document verbatim.
func (s *Snapshot) MarshalJSON() ([]byte, error) { return s.raw, nil }

// UnmarshalJSON parses and validates like Parse.
func (s *Snapshot) UnmarshalJSON(b []byte) error {
	p, err := Parse(b)
	if err != nil {
		return err
	}
	s.TaskID, s.TenantID, s.ProjectID, s.UserID = p.TaskID, p.TenantID, p.ProjectID, p.UserID
	s.Status, s.Version, s.UpdatedAt, s.raw = p.Status, p.Version, p.UpdatedAt, p.raw
	return nil
}

// NewerThan reports whether s should replace a snapshot of version v.
// Versions only go up: an equal version is not newer.
func (s *Snapshot) NewerThan(v int64) bool { return s.Version > v }

// Terminal reports whether the task will not change again.
func (s *Snapshot) Terminal() bool { return TerminalStatus(s.Status) }

// TerminalStatus reports whether status is one a task ends in: SUCCEEDED,
// FAILED or CANCELED.
func TerminalStatus(status string) bool {
	switch status {
	case "SUCCEEDED", "FAILED", "CANCELED":
		return true
	}
	return false
}

// TTL is how long Redis keeps a snapshot of the given status: short while a
// task moves, long once it has ended. Unknown statuses get the shortest.
func TTL(status string) time.Duration {
	switch status {
	case "QUEUED":
		return 30 * time.Second
	case "SUCCEEDED":
		return time.Hour
	case "FAILED", "CANCELED":
		return 30 * time.Minute
	default: // RUNNING, PROVIDER_SUBMITTED, POST_PROCESSING and anything new
		return 10 * time.Second
	}
}

// TTLWithJitter adds up to 10 % to TTL(status), so snapshots written together
// do not expire together.
func TTLWithJitter(status string) time.Duration {
	base := TTL(status)
	return base + time.Duration(rand.Int64N(int64(base)/10+1))
}
