package testenv

import (
	"net"
	"os"
	"runtime"
	"runtime/pprof"
	"testing"
)

// LiveBytesPerConn measures what n idle connections keep live in this
// process. It opens one with open(n) first, which starts what a first
// connection starts and warms the pools, then open(0) to open(n-1), waits
// until registered reports every one in place, and returns the heap in use
// after two full collections plus goroutine stacks that the n added, per
// connection. The connections are closed when the test ends. With
// IDLEMEM_PROF set to a file name it writes a heap profile there at the
// measurement (run the test with -memprofilerate=1 for every allocation).
//
// The race detector changes what allocates and how big objects are: call
// it from tests built with !race.
func LiveBytesPerConn(t testing.TB, n int, open func(i int) net.Conn, registered func() bool) int64 {
	t.Helper()
	held := make([]net.Conn, n+1)
	t.Cleanup(func() {
		for _, c := range held {
			if c != nil {
				c.Close()
			}
		}
	})
	held[n] = open(n)
	before := liveBytes()
	for i := range n {
		held[i] = open(i)
	}
	Eventually(t, "every connection registered", registered)
	per := (liveBytes() - before) / int64(n)
	if f := os.Getenv("IDLEMEM_PROF"); f != "" {
		if out, err := os.Create(f); err == nil {
			pprof.WriteHeapProfile(out)
			out.Close()
		}
	}
	runtime.KeepAlive(held)
	return per
}

// liveBytes is the heap in use after a full collection, plus goroutine
// stacks.
func liveBytes() int64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return int64(m.HeapAlloc) + int64(m.StackInuse)
}
