package hub

import (
	"testing"
	"unsafe"
)

// TestConnSize guards the size class of a Conn, which every connection,
// idle or not, keeps for its life. Its sets are inline (idSet, trackSet),
// which made it 464 bytes, a 480-byte object; with its flags grouped it is
// 448. A flag moved back among the other fields fails this.
func TestConnSize(t *testing.T) {
	if n := unsafe.Sizeof(Conn{}); n > 448 {
		t.Fatalf("a Conn is %d bytes, want at most 448: keep the flags together, and allocate what idle connections do not use", n)
	}
}

// TestTrackedSize guards the entry a connection keeps per task it watched
// or was sent, which a connection watching a project can hold hundreds
// of: 48 bytes, a size class of its own. The time it was sent fits in the
// padding after news's flag; a nested news struct would not leave it.
func TestTrackedSize(t *testing.T) {
	if n := unsafe.Sizeof(tracked{}); n > 48 {
		t.Fatalf("a tracked entry is %d bytes, want at most 48: fit new fields in its padding", n)
	}
}

// TestTaskNoteSize guards the note a node keeps per task watched by id
// (the last hint and read, for InspectTask): four words, the 32-byte size
// class; a mutex beside them took 48.
func TestTaskNoteSize(t *testing.T) {
	if n := unsafe.Sizeof(taskNote{}); n > 32 {
		t.Fatalf("a task's note is %d bytes, want at most 32", n)
	}
}
