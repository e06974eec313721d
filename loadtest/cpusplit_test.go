package main

import (
	"context"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
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

// perf samples only between enable and disable: a split never enabled
// took no samples, one enabled while its process ran took some, and one
// whose perf could not attach fails at enable.
func TestCPUSplitSamplesOnlyWhileEnabled(t *testing.T) {
	if _, err := exec.LookPath("perf"); err != nil {
		t.Skip("perf is not installed")
	}
	if os.Geteuid() != 0 {
		t.Skip("perf samples another process as root")
	}
	spin := exec.Command("sh", "-c", "while true; do :; done")
	if err := spin.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = spin.Process.Kill(); _ = spin.Wait() })
	pid := spin.Process.Pid
	// run waits until the spinning process has had ten more clock ticks
	// of CPU time.
	run := func() {
		until := procCPU(pid) + 10
		for procCPU(pid) < until {
			time.Sleep(5 * time.Millisecond)
		}
	}
	ctx := context.Background()
	dir := t.TempDir()

	s, err := startCPUSplit(dir, []int{pid})
	if err != nil {
		t.Fatal(err)
	}
	run()
	if _, n, _, err := s.stop(ctx, ""); err == nil {
		t.Errorf("a split never enabled took %d samples", n)
	}

	s, err = startCPUSplit(dir, []int{pid})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.enable(); err != nil {
		t.Fatal(err)
	}
	run()
	if err := s.disable(); err != nil {
		t.Fatal(err)
	}
	run()
	kernel, n, _, err := s.stop(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	if n == 0 || kernel < 0 || kernel > 1 {
		t.Errorf("%d samples, %.2f in the kernel", n, kernel)
	}

	gone := exec.Command("true")
	if err := gone.Run(); err != nil {
		t.Fatal(err)
	}
	s, err = startCPUSplit(dir, []int{gone.Process.Pid})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.enable(); err == nil {
		t.Error("perf attached to a process that had ended")
	}
	if _, _, _, err := s.stop(ctx, ""); err == nil {
		t.Error("a split of a process that had ended read without error")
	}
}
