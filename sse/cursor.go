package sse

import (
	"strconv"
	"strings"

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
