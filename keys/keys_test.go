package keys

import (
	"slices"
	"strings"
	"testing"
)

// FuzzJoinIsInjective: two pairs of ids share a spelling only when they are
// the same pair, a pair never shares one with a single id, Split gives the
// ids back, and no escaped id can end a hash tag or hold the separator.
func FuzzJoinIsInjective(f *testing.F) {
	f.Add("tY:a", "b", "tY", "a:b")
	f.Add("x", "y}:user:z", "x}:user:y", "z")
	f.Add("", ":", ":", "")
	f.Add("a b", "+", "a+b", " ")
	f.Add("%3A", "", ":", "")
	f.Fuzz(func(t *testing.T, a, b, c, d string) {
		if Join(a, b) == Join(c, d) && (a != c || b != d) {
			t.Fatalf("(%q, %q) and (%q, %q) are both spelled %q", a, b, c, d, Join(a, b))
		}
		if Join(a, b) == Join(c) {
			t.Fatalf("(%q, %q) and (%q) are both spelled %q", a, b, c, Join(c))
		}
		ids, err := Split(Join(a, b))
		if err != nil || !slices.Equal(ids, []string{a, b}) {
			t.Fatalf("Split(Join(%q, %q)) = %q, %v", a, b, ids, err)
		}
		if e := Join(a); strings.ContainsAny(e, ":{}") {
			t.Fatalf("Join(%q) = %q holds a separator or a brace", a, e)
		}
	})
}

func TestJoinKeepsPlainIDs(t *testing.T) {
	if got := Join("tenant_1", "user-2.x~"); got != "tenant_1:user-2.x~" {
		t.Fatalf("Join of plain ids = %q", got)
	}
	if got := Join("tY:a", "b"); got != "tY%3Aa:b" {
		t.Fatalf(`Join("tY:a", "b") = %q`, got)
	}
}
