package sse

import (
	"encoding/base64"
	"encoding/binary"
	"hash/fnv"
	"slices"
	"strconv"
	"strings"

	"github.com/pushd/pushd/hub"
	"github.com/pushd/pushd/snapshot"
)

// maxCursorTasks bounds how many task versions one event id carries. A task
// missing from a cursor is simply sent again on resume, which is correct,
// only less frugal.
const maxCursorTasks = 32

// maxCursorLen bounds the Last-Event-ID pushd parses.
const maxCursorLen = 4096

// encodeCursor writes the versions as "task=version,task=version". Neither
// '=' nor ',' can occur in an id (snapshot.ValidID).
func encodeCursor(b []byte, versions map[string]int64) []byte {
	first := true
	for id, v := range versions {
		if !first {
			b = append(b, ',')
		}
		first = false
		b = append(b, id...)
		b = append(b, '=')
		b = strconv.AppendInt(b, v, 10)
	}
	return b
}

// parseCursor reads a Last-Event-ID. Entries that do not parse are ignored:
// a bad cursor costs a resend, never an error, so a client with a cursor from
// another server version still reconnects.
func parseCursor(s string) map[string]int64 {
	if s == "" || len(s) > maxCursorLen {
		return nil
	}
	out := make(map[string]int64)
	for part := range strings.SplitSeq(s, ",") {
		id, v, ok := strings.Cut(part, "=")
		if !ok || !snapshot.ValidID(id) {
			continue
		}
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n <= 0 {
			continue
		}
		out[id] = n
	}
	return out
}

// A stream cursor says the client holds every change, up to a position in
// its tenant's stream, of what its connection watched: resumed, it is sent
// only what moved after that position. For a task it did not watch, the
// cursor says nothing, so the node writes the hub's stream cursors with the
// fingerprint of the subscription they were issued for, "s1.<base64url>.<fp>"
// (the hub's part never holds a '.' after its prefix), and resumes from one
// only for that same subscription.
//
// Only the same one: a subscription that shrank could in principle resume
// too, but a fingerprint tells equal from different, not a subset, and a
// cursor carrying the whole set would outgrow any bound on its length. A
// changed subscription costs one full read: correct, only less frugal.

// fingerprint is 48 bits of FNV-64a, in base64url, of the canonical
// subscription: its task ids and its project ids, each sorted and without
// repeats, and its user scope, so a reordered or repeated URL has the same
// one. It tells subscriptions apart and guards nothing: a client forging
// one can only keep itself from tasks it asked for.
func fingerprint(s hub.Subscription) string {
	h := fnv.New64a()
	for _, ids := range [][]string{s.Tasks, s.Projects} {
		for _, id := range slices.Compact(slices.Sorted(slices.Values(ids))) {
			h.Write([]byte(id))
			h.Write([]byte{','}) // never in an id (snapshot.ValidID)
		}
		h.Write([]byte{'|'})
	}
	if s.User {
		h.Write([]byte("user"))
	}
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], h.Sum64())
	return base64.RawURLEncoding.EncodeToString(b[:6])
}

// appendStreamCursor appends the hub's stream cursor c bound to the
// subscription of fingerprint fp.
func appendStreamCursor(b []byte, c, fp string) []byte {
	b = append(b, c...)
	b = append(b, '.')
	return append(b, fp...)
}

// appendOwnVersion appends to a task event's stream cursor the event's
// own version, ",task=version". The position is the one read when the
// write was taken, which need not yet cover the stream entry of the very
// change the event carries (its hint may come before the tail applies the
// entry): the replay after it would send that change again, though the
// client holds it. Neither ',' nor '=' occurs in the hub's cursor, its
// fingerprint or an id.
func appendOwnVersion(b []byte, s *snapshot.Snapshot) []byte {
	b = append(b, ',')
	b = append(b, s.TaskID...)
	b = append(b, '=')
	return strconv.AppendInt(b, s.Version, 10)
}

// cutOwnVersion splits a stream cursor into what appendStreamCursor wrote
// and the versions after it (none for a sync's cursor, or one of a node
// from before them).
func cutOwnVersion(s string) (streamCursor string, versions map[string]int64) {
	c, own, ok := strings.Cut(s, ",")
	if !ok {
		return s, nil
	}
	return c, parseCursor(own)
}

// cutFingerprint splits what appendStreamCursor wrote into the hub's
// cursor and the fingerprint; ok is false for a cursor without one (of a
// node from before fingerprints), whose only '.' ends its prefix.
func cutFingerprint(s string) (cursor, fp string, ok bool) {
	i := strings.LastIndexByte(s, '.')
	if i <= strings.IndexByte(s, '.') {
		return s, "", false
	}
	return s[:i], s[i+1:], true
}
