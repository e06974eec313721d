package cursor

import (
	"strings"
	"testing"
)

func TestCursorRoundTripAndStrictness(t *testing.T) {
	p := Position{Tag: TenantTag("t1"), Epoch: ID{1710000000000, 0}, ID: ID{1710000012345, 7}}
	c := Encode(p)
	if !Is(c) || len(c) > 32 || strings.ContainsAny(c, "=,") {
		t.Fatalf("cursor %q: want a short s1. cursor without '=' or ','", c)
	}
	got, err := Decode(c)
	if err != nil || got != p {
		t.Fatalf("decode(%q) = %+v, %v; want %+v", c, got, err, p)
	}
	for _, bad := range []string{
		"", "s1.", "s2." + c[3:], c[3:], c + "A", c[:len(c)-1], c + "=", "s1.!!!!",
		strings.Replace(c, c[5:6], "*", 1),
		"s1." + strings.Repeat("A", 80),
		Encode(Position{Tag: 1, Epoch: ID{5, 0}, ID: ID{5, 0}})[:3] + "AAAAAQ", // too short
	} {
		if _, err := Decode(bad); err == nil {
			t.Errorf("decode(%q) accepted", bad)
		}
	}
	// An id before its epoch cannot be: 5-3 is before the epoch 5-4.
	b := Encode(Position{Tag: 1, Epoch: ID{5, 4}, ID: ID{5, 3}})
	if _, err := Decode(b); err == nil {
		t.Error("a cursor before its epoch was accepted")
	}
}

func FuzzDecodeCursor(f *testing.F) {
	f.Add(Encode(Position{Tag: 9, Epoch: ID{1, 2}, ID: ID{3, 4}}))
	f.Add("s1.AAAA")
	f.Fuzz(func(t *testing.T, s string) {
		p, err := Decode(s)
		if err != nil {
			return
		}
		if again := Encode(p); again != s {
			t.Fatalf("%q decodes to %+v, which encodes as %q: two spellings of one Position", s, p, again)
		}
	})
}
