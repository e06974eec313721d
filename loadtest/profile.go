package main

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
)

// profileEnv names a directory where each worker writes profiles of its
// run (-profile-workers): its CPU profile, and its heap in use at each
// report.
const profileEnv = "PUSHD_LOADTEST_PROFILE"

// heapSampleBytes is a profiling worker's MemProfileRate: the default,
// a sample per 512 KB allocated, would see few of the few hundred bytes a
// connection holds.
const heapSampleBytes = 512

// profiler writes a worker's profiles; without a directory it writes none.
type profiler struct {
	dir string
	cpu *os.File // the CPU profile being written, nil if none
}

// newProfiler reads the directory from the environment; it must run before
// the worker allocates what its heap profile should show.
func newProfiler() *profiler {
	p := &profiler{dir: os.Getenv(profileEnv)}
	if p.dir != "" {
		runtime.MemProfileRate = heapSampleBytes
	}
	return p
}

func (p *profiler) path(worker int, kind string) string {
	return filepath.Join(p.dir, fmt.Sprintf("worker%d.%s.pprof", worker, kind))
}

// startCPU starts the CPU profile of the worker numbered worker.
func (p *profiler) startCPU(worker int) {
	if p == nil || p.dir == "" || p.cpu != nil {
		return
	}
	f, err := os.Create(p.path(worker, "cpu"))
	if err != nil {
		return
	}
	if pprof.StartCPUProfile(f) != nil {
		f.Close()
		return
	}
	p.cpu = f
}

// writeHeap writes the heap in use now to worker<n>.heap.pprof, replacing
// an earlier one. It collects garbage first, as the profile counts what the
// last collection left.
func (p *profiler) writeHeap(worker int) error {
	if p == nil || p.dir == "" {
		return nil
	}
	runtime.GC()
	f, err := os.Create(p.path(worker, "heap"))
	if err != nil {
		return err
	}
	if err := pprof.Lookup("heap").WriteTo(f, 0); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// stop ends the CPU profile.
func (p *profiler) stop() {
	if p != nil && p.cpu != nil {
		pprof.StopCPUProfile()
		p.cpu.Close()
		p.cpu = nil
	}
}
