package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// perfHz is how often, per second of the server's own CPU time, perf
// samples where it runs: about 400 samples a second of a server at 0.4
// cores, 24,000 in a 60 s window, a fraction known to ±0.3 %. Sampling
// interrupts the server, at a cost under the runs' noise (the server's
// CPU per delivery was the same with and without it).
const perfHz = 997

// cpuSplit samples the servers under test with perf to divide their CPU
// time between their own code and the kernel. /proc's user and system
// times are counted whole ticks at a time on kernels without virtual CPU
// accounting (CONFIG_TICK_CPU_ACCOUNTING, 250 Hz on the machines here): a
// tick goes to whichever mode the CPU is in when it comes, and a server
// woken by the publisher's 1 ms schedule is in step with the tick for long
// stretches, so the split moved between runs whose total did not. perf's
// cpu-clock samples every 1/perfHz s of the server's own CPU time, out of
// step with both.
type cpuSplit struct {
	cmd  *exec.Cmd
	data string
	done chan error
}

// startCPUSplit starts perf on pids; the split is read by stop. It fails
// when perf is missing or may not sample the servers.
func startCPUSplit(dir string, pids []int) (*cpuSplit, error) {
	perf, err := exec.LookPath("perf")
	if err != nil {
		return nil, err
	}
	if len(pids) == 0 {
		return nil, errors.New("no server process")
	}
	list := make([]string, len(pids))
	for i, p := range pids {
		list[i] = strconv.Itoa(p)
	}
	s := &cpuSplit{data: filepath.Join(dir, fmt.Sprintf("cpusplit-%d.perf", time.Now().UnixNano())), done: make(chan error, 1)}
	s.cmd = exec.Command(perf, "record", "--quiet", "-e", "cpu-clock", "-F", strconv.Itoa(perfHz),
		"-p", strings.Join(list, ","), "-o", s.data)
	var stderr strings.Builder
	s.cmd.Stderr = &stderr
	if err := s.cmd.Start(); err != nil {
		return nil, err
	}
	go func() {
		err := s.cmd.Wait()
		if err != nil && stderr.Len() > 0 {
			err = fmt.Errorf("%w: %s", err, strings.TrimSpace(stderr.String()))
		}
		s.done <- err
	}()
	// perf that may not attach ends at once.
	select {
	case err := <-s.done:
		return nil, fmt.Errorf("perf record ended: %v", err)
	case <-time.After(200 * time.Millisecond):
	}
	return s, nil
}

// stop ends the sampling and returns the fraction of the samples taken in
// the kernel, how many samples there were, and how many of the kernel's
// came on a return from a system call (countModes).
func (s *cpuSplit) stop(ctx context.Context, keep string) (kernel float64, samples, onReturn int, err error) {
	defer func() {
		if keep == "" || os.Rename(s.data, keep) != nil {
			os.Remove(s.data)
		}
	}()
	_ = s.cmd.Process.Signal(syscall.SIGINT)
	select {
	case err := <-s.done:
		var exit *exec.ExitError
		if err != nil && !errors.As(err, &exit) {
			return 0, 0, 0, err
		}
	case <-time.After(30 * time.Second):
		_ = s.cmd.Process.Kill()
		<-s.done
		return 0, 0, 0, errors.New("perf record did not end")
	}
	cmd := exec.CommandContext(ctx, s.cmd.Path, "script", "-i", s.data, "-F", "pid,ip")
	out, err := cmd.StdoutPipe()
	if err != nil {
		return 0, 0, 0, err
	}
	if err := cmd.Start(); err != nil {
		return 0, 0, 0, err
	}
	user, kern, onReturn := countModes(out, syscallInsn[runtime.GOARCH], readBefore)
	if err := cmd.Wait(); err != nil {
		return 0, 0, 0, fmt.Errorf("perf script: %w", err)
	}
	if user+kern == 0 {
		return 0, 0, 0, errors.New("perf took no samples")
	}
	return float64(kern) / float64(user+kern), user + kern, onReturn, nil
}

// syscallInsn is the instruction that enters the kernel, by architecture.
var syscallInsn = map[string][]byte{
	"amd64": {0x0f, 0x05},             // syscall
	"arm64": {0x01, 0x00, 0x00, 0xd4}, // svc #0
}

// readBefore reads the n bytes before ip in pid's memory (the servers are
// still running when the split is read).
func readBefore(pid int, ip uint64, n int) []byte {
	f, err := os.Open(fmt.Sprintf("/proc/%d/mem", pid))
	if err != nil {
		return nil
	}
	defer f.Close()
	b := make([]byte, n)
	if _, err := f.ReadAt(b, int64(ip)-int64(n)); err != nil {
		return nil
	}
	return b
}

// countModes counts perf script's samples, a pid and an instruction
// pointer in hexadecimal a line, by where they were taken: x86-64 and
// arm64 map the kernel in the upper half of the address space, user
// space in the lower. A sample at the instruction just after a system
// call counts as the kernel's: it was due while the kernel ran with
// interrupts off and came on the return to user space (on the
// paravirtualized guests here, where the sampling interrupt waits for
// interrupts to be enabled, a few percent of all samples land there;
// their user code is one instruction). insn is the system call
// instruction (none: no sample counts so); before reads the bytes before
// an address of a process.
func countModes(r io.Reader, insn []byte, before func(pid int, ip uint64, n int) []byte) (user, kernel, onReturn int) {
	type at struct {
		pid int
		ip  uint64
	}
	afterSyscall := map[at]bool{}
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) != 2 {
			continue
		}
		pid, err1 := strconv.Atoi(f[0])
		ip, err2 := strconv.ParseUint(f[1], 16, 64)
		if err1 != nil || err2 != nil {
			continue
		}
		if ip >= 1<<63 {
			kernel++
			continue
		}
		k := at{pid, ip}
		was, seen := afterSyscall[k]
		if !seen {
			was = insn != nil && bytes.Equal(before(pid, ip, len(insn)), insn)
			afterSyscall[k] = was
		}
		if was {
			kernel++
			onReturn++
		} else {
			user++
		}
	}
	return user, kernel, onReturn
}

// startCPUSplit starts sampling the servers' split by -cpu-split: nil
// for /proc's.
func (r *run) startCPUSplit() *cpuSplit {
	if r.cfg.CPUSplit == "proc" {
		return nil
	}
	var pids []int
	for _, s := range r.nodes {
		if p := s.current(); p != nil {
			pids = append(pids, p.pid())
		}
	}
	s, err := startCPUSplit(r.tmp, pids)
	if err != nil {
		if r.cfg.CPUSplit == "perf" {
			r.res.note("-cpu-split perf: %v; the split is /proc's", err)
		}
		return nil
	}
	return s
}

// endCPUSplit stops s and returns the kernel's share of the servers' CPU,
// or -1 for /proc's split.
func (r *run) endCPUSplit(ctx context.Context, s *cpuSplit) float64 {
	if s == nil {
		return -1
	}
	keep := ""
	if r.cfg.ProfileNodes != "" {
		keep = filepath.Join(r.cfg.ProfileNodes, r.kind.name+".measure.perf")
	}
	share, samples, onReturn, err := s.stop(ctx, keep)
	if err != nil {
		r.res.note("perf's split failed (%v); the split is /proc's", err)
		return -1
	}
	r.logf("perf: %d samples, %.1f %% in the kernel, %d of them on a return from a system call", samples, 100*share, onReturn)
	return share
}
