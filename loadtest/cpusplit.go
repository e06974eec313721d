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
	ctl  *os.File      // perf's control channel: enable, disable
	ack  *os.File      // its answers, one "ack" line a command
	acks *bufio.Reader // over ack
}

// startCPUSplit starts perf on pids with sampling off; enable and
// disable bound the window it samples, and stop reads the split. It fails
// when perf is missing.
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
	ctlR, ctlW, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	ackR, ackW, err := os.Pipe()
	if err != nil {
		ctlR.Close()
		ctlW.Close()
		return nil, err
	}
	s := &cpuSplit{
		data: filepath.Join(dir, fmt.Sprintf("cpusplit-%d.perf", time.Now().UnixNano())),
		done: make(chan error, 1),
		ctl:  ctlW, ack: ackR, acks: bufio.NewReader(ackR),
	}
	// Descriptors 3 and 4 are ExtraFiles' first two.
	s.cmd = exec.Command(perf, "record", "--quiet", "-e", "cpu-clock", "-F", strconv.Itoa(perfHz),
		"--delay=-1", "--control", "fd:3,4", "-p", strings.Join(list, ","), "-o", s.data)
	s.cmd.ExtraFiles = []*os.File{ctlR, ackW}
	var stderr strings.Builder
	s.cmd.Stderr = &stderr
	err = s.cmd.Start()
	// Only perf holds these ends now: when it exits, the last writer of
	// its answers closes, and a command waiting for one reads EOF at once.
	ctlR.Close()
	ackW.Close()
	if err != nil {
		s.ctl.Close()
		s.ack.Close()
		return nil, err
	}
	go func() {
		err := s.cmd.Wait()
		if err != nil && stderr.Len() > 0 {
			err = fmt.Errorf("%w: %s", err, strings.TrimSpace(stderr.String()))
		}
		s.done <- err
	}()
	return s, nil
}

// enable starts the sampling and returns once perf has: the window's
// first mark comes after it.
func (s *cpuSplit) enable() error { return s.command("enable") }

// disable ends the sampling; the window's last mark comes before it.
func (s *cpuSplit) disable() error { return s.command("disable") }

// command sends perf a control command and waits for its answer. A perf
// that could not attach to the servers has ended, and the answer is EOF.
func (s *cpuSplit) command(c string) error {
	if _, err := s.ctl.WriteString(c + "\n"); err != nil {
		return fmt.Errorf("perf %s: %w", c, err)
	}
	_ = s.ack.SetReadDeadline(time.Now().Add(10 * time.Second))
	line, err := s.acks.ReadString('\n')
	if errors.Is(err, io.EOF) {
		return fmt.Errorf("perf %s: perf record ended (see its exit)", c)
	}
	if err != nil {
		return fmt.Errorf("perf %s: %w", c, err)
	}
	// perf writes its answer with C's terminating NUL: "ack\n\x00".
	if strings.Trim(line, "\x00\n") != "ack" {
		return fmt.Errorf("perf %s: answered %q", c, line)
	}
	return nil
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
	// The control channel is closed only once perf has ended: perf that
	// finds it closed before SIGINT leaves its data unfinished.
	defer s.ctl.Close()
	defer s.ack.Close()
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
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		return 0, 0, 0, err
	}
	mem := procMem{}
	defer mem.close()
	user, kern, onReturn := countModes(out, syscallInsn[runtime.GOARCH], mem.before)
	if err := cmd.Wait(); err != nil {
		return 0, 0, 0, fmt.Errorf("perf script: %w: %s", err, strings.TrimSpace(stderr.String()))
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

// procMem reads the servers' memory, one open file a process (they are
// still running when the split is read).
type procMem map[int]*os.File

// before returns the n bytes before ip in pid's memory, nil if unreadable.
func (m procMem) before(pid int, ip uint64, n int) []byte {
	f, ok := m[pid]
	if !ok {
		f, _ = os.Open(fmt.Sprintf("/proc/%d/mem", pid))
		m[pid] = f // nil too: one try a process
	}
	if f == nil {
		return nil
	}
	b := make([]byte, n)
	if _, err := f.ReadAt(b, int64(ip)-int64(n)); err != nil {
		return nil
	}
	return b
}

func (m procMem) close() {
	for _, f := range m {
		if f != nil {
			f.Close()
		}
	}
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

// startCPUSplit starts sampling the servers' split by -cpu-split, and
// returns once perf samples: nil for /proc's.
func (r *run) startCPUSplit(ctx context.Context) *cpuSplit {
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
	if err == nil {
		if err = s.enable(); err != nil {
			_, _, _, stopErr := s.stop(ctx, "")
			err = errors.Join(err, stopErr)
		}
	}
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
	err := s.disable()
	share, samples, onReturn, stopErr := s.stop(ctx, keep)
	if err = errors.Join(err, stopErr); err != nil {
		r.res.note("perf's split failed (%v); the split is /proc's", err)
		return -1
	}
	r.logf("perf: %d samples, %.1f %% in the kernel, %d of them on a return from a system call", samples, 100*share, onReturn)
	return share
}
