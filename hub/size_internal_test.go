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
