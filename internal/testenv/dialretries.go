package testenv

import (
	"bytes"
	"runtime"
	"testing"
	"time"
)

// WaitDialRetriesEnded waits until go-redis's background dial retries have
// ended. A pool whose dial failed (to a killed or unreachable server) retries in a
// goroutine that sleeps a second between attempts and sees its pool closed
// only when it wakes; a package's leak check would otherwise report it.
// One still running after a few seconds belongs to a pool nobody closed.
func WaitDialRetriesEnded(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if !bytes.Contains(buf[:n], []byte("(*ConnPool).tryDial")) {
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("a go-redis dial retry still runs 5s after the test's clients closed:\n%s", buf[:n])
			return
		}
		time.Sleep(50 * time.Millisecond) // a library goroutine we cannot wait on; poll with a deadline
	}
}
