package keys

import (
	"strings"
	"testing"
)

// The hash is Redis Cluster's: CRC-16/XMODEM's check value, a slot Redis
// reports (CLUSTER KEYSLOT foo), and the hash-tag rules of the cluster
// specification.
func TestSlotIsRedisClusters(t *testing.T) {
	if got := crc16("123456789"); got != 0x31C3 {
		t.Fatalf("crc16(123456789) = %#x, want 0x31c3", got)
	}
	if got := slot("foo"); got != 12182 {
		t.Fatalf("slot(foo) = %d, want 12182", got)
	}
	for _, c := range []struct{ key, same string }{
		{"{user1000}.following", "user1000"},
		{"foo{}{bar}", "foo{}{bar}"}, // an empty first tag: the whole key
		{"foo{{bar}}zap", "{bar"},
		{"foo{bar}{zap}", "bar"},
		{"task.changed.{t1}", "t1"},
	} {
		if got, want := slot(c.key), int(crc16(c.same)%slotCount); got != want {
			t.Errorf("slot(%q) = %d, want %d (the slot of %q)", c.key, got, want, c.same)
		}
	}
}

// For every slot, the tag hashes to it, has no brace, and is the shortest
// string of the alphabet that does: no string of fewer characters lands in
// its slot. ShardLiveness puts it in the channel's hash tag, a prefix
// notwithstanding.
func TestSlotTagOfEverySlot(t *testing.T) {
	shorter := map[int]map[int]bool{1: {}, 2: {}, 3: {}} // length → slots some shorter string hashes to
	for _, a := range tagAlphabet {
		s := slot(string(a))
		shorter[2][s], shorter[3][s] = true, true
		for _, b := range tagAlphabet {
			shorter[3][slot(string(a)+string(b))] = true
		}
	}
	// The example of docs/DESIGN.md, "Key names".
	if got := (Names{}).ShardLiveness(0); got != "pushd.liveness.{06S}" {
		t.Fatalf("ShardLiveness(0) = %q, the docs say pushd.liveness.{06S}", got)
	}
	names := Names{Prefix: "env-1:"}
	for s := range slotCount {
		tag := slotTag(s)
		if tag == "" || len(tag) > 3 || strings.ContainsAny(tag, "{}") {
			t.Fatalf("slot %d: tag %q", s, tag)
		}
		if got := slot(tag); got != s {
			t.Fatalf("slot %d: tag %q hashes to %d", s, tag, got)
		}
		if shorter[len(tag)][s] {
			t.Fatalf("slot %d: tag %q, but a shorter string hashes to it", s, tag)
		}
		ch := names.ShardLiveness(s)
		if got := slot(ch); got != s || ch != "env-1:pushd.liveness.{"+tag+"}" {
			t.Fatalf("ShardLiveness(%d) = %q, in slot %d", s, ch, got)
		}
	}
}
