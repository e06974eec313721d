package main

import (
	"strings"
	"testing"
)

// perf script -F pid,ip prints a process and an instruction pointer a
// sample; the kernel's are in the upper half of the address space, and a
// user one just after a system call instruction is the kernel's too.
func TestCountModesSplitsByAddress(t *testing.T) {
	insn := syscallInsn["amd64"]
	out := strings.Join([]string{
		"  101          4a3b2c",
		"  101  ffffffff81a0c2d5",
		"  102  ffffffffc04f1e20",
		"  102    7f2e1c0a9b10",
		"  101          4a3b3d", // after a syscall
		"  101          4a3b3d",
		"  102          4a3b3d", // another process: not after one there
		"",
		"not an address",
	}, "\n")
	reads := 0
	before := func(pid int, ip uint64, n int) []byte {
		reads++
		if pid == 101 && ip == 0x4a3b3d {
			return insn
		}
		return make([]byte, n)
	}
	user, kernel, onReturn := countModes(strings.NewReader(out), insn, before)
	if user != 3 || kernel != 4 || onReturn != 2 {
		t.Errorf("user %d, kernel %d, on return %d: want 3, 4 and 2", user, kernel, onReturn)
	}
	if reads != 4 {
		t.Errorf("%d reads of memory for 4 user addresses", reads)
	}
}
