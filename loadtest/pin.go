package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// With -pin, the server under test runs on serverCPU alone and everything
// else the run makes or leans on (this controller, the workers, the private
// Redis, the shared PostgreSQL's processes) on loadCPU: the server's CPU is
// then its own, whatever the load generator burns.
const (
	serverCPU = "0"
	loadCPU   = "1"
)

// pinTo makes cmd run on cpus (a taskset list) when cpus is set: taskset
// sets the mask before it execs the command, so every thread it makes
// inherits it, and the pid stays the command's.
func pinTo(cmd *exec.Cmd, cpus string) error {
	if cpus == "" {
		return nil
	}
	taskset, err := exec.LookPath("taskset")
	if err != nil {
		return fmt.Errorf("-pin needs taskset (util-linux): %w", err)
	}
	cmd.Args = append([]string{"taskset", "-c", cpus, cmd.Path}, cmd.Args[1:]...)
	cmd.Path = taskset
	return nil
}

// pinSelf moves every thread of this process to cpu; threads made later
// inherit it from the thread that makes them.
func pinSelf(cpu int) error {
	var set unix.CPUSet
	set.Set(cpu)
	tasks, err := os.ReadDir("/proc/self/task")
	if err != nil {
		return err
	}
	for _, t := range tasks {
		tid, err := strconv.Atoi(t.Name())
		if err != nil {
			continue
		}
		if err := unix.SchedSetaffinity(tid, &set); err != nil && err != unix.ESRCH {
			return fmt.Errorf("pin thread %d: %w", tid, err)
		}
	}
	return nil
}

// pinProcesses moves every thread of the processes named comm (the shared
// PostgreSQL: its postmaster and backends, whose new backends inherit the
// postmaster's mask) to cpu, and returns what gives them every CPU back.
func pinProcesses(comm string, cpu int) (restore func(), err error) {
	var set, all unix.CPUSet
	set.Set(cpu)
	for i := range runtime.NumCPU() {
		all.Set(i)
	}
	apply := func(s *unix.CPUSet) error {
		dirs, _ := filepath.Glob("/proc/[0-9]*/task/[0-9]*")
		n := 0
		for _, d := range dirs {
			b, err := os.ReadFile(filepath.Join(d, "comm"))
			if err != nil || strings.TrimSpace(string(b)) != comm {
				continue
			}
			tid, _ := strconv.Atoi(filepath.Base(d))
			if err := unix.SchedSetaffinity(tid, s); err == nil {
				n++
			}
		}
		if n == 0 {
			return fmt.Errorf("no %s process to pin", comm)
		}
		return nil
	}
	if err := apply(&set); err != nil {
		return func() {}, err
	}
	return func() { apply(&all) }, nil
}
