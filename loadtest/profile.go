package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"sync"
	"time"
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

// profileNodes writes a CPU profile of each node in nodes over the next
// span, fetched from its debug listener (-profile-nodes), to
// dir/node<i>.<label>.pprof, i its index among every node, and its
// goroutines a third of the way in to dir/node<i>.<label>.goroutines.txt,
// and returns once each is written or failed. A node without a debug
// listener is skipped.
func (r *run) profileNodes(ctx context.Context, nodes []int, label string, span time.Duration) {
	if err := os.MkdirAll(r.cfg.ProfileNodes, 0o755); err != nil {
		r.res.warn("profiles of the nodes: %v", err)
		return
	}
	var wg sync.WaitGroup
	for _, i := range nodes {
		s := r.nodes[i]
		if s.debugPort == 0 {
			continue
		}
		wg.Go(func() {
			url := fmt.Sprintf("http://127.0.0.1:%d/debug/pprof/profile?seconds=%d", s.debugPort, int(span.Seconds()))
			path := filepath.Join(r.cfg.ProfileNodes, fmt.Sprintf("node%d.%s.pprof", i, label))
			if err := download(ctx, url, path); err != nil {
				r.res.warn("profile of node %d (%s): %v", i, label, err)
			}
		})
		// Where the node's goroutines wait, a third of the way in: what
		// a CPU profile of an idle node cannot show.
		wg.Go(func() {
			if sleepCtx(ctx, span/3) != nil {
				return
			}
			url := fmt.Sprintf("http://127.0.0.1:%d/debug/pprof/goroutine?debug=1", s.debugPort)
			path := filepath.Join(r.cfg.ProfileNodes, fmt.Sprintf("node%d.%s.goroutines.txt", i, label))
			if err := download(ctx, url, path); err != nil {
				r.res.warn("goroutines of node %d (%s): %v", i, label, err)
			}
		})
	}
	wg.Wait()
}

// download writes what url answers to path.
func download(ctx context.Context, url, path string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %s", url, resp.Status)
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
