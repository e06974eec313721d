//go:build !race

// The race detector changes what allocates and how big objects are, so
// memory guards run without it: scripts/test runs them in a step of their
// own.

package hub

import (
	"runtime"
	"strconv"
	"testing"
	"time"
)

// TestPaidReadsMemory bounds what the record of paid reads keeps for a
// user whose one connection subscribed to one task, the common case of one
// user per browser: it lives for rewatchGrace after the user's last
// subscribe, then sweep drops it.
func TestPaidReadsMemory(t *testing.T) {
	const users = 10000
	var b readBudgets
	b.init(50, 500, 400)
	keys, watches := make([]key, users), make([]watch, users)
	for i := range users {
		keys[i] = key{"t1", "user_" + strconv.Itoa(i)}
		watches[i] = watch{byTask, "task_" + strconv.Itoa(i)}
	}
	now := time.Now()
	before := heapInUse()
	for i := range users {
		b.paid(keys[i], watches[i], now)
	}
	per := (heapInUse() - before) / users
	runtime.KeepAlive(&b)
	t.Logf("%d bytes live per user with one paid read", per)
	if per > 128 {
		t.Errorf("%d bytes per user's paid read, want at most 128", per)
	}
	b.sweep(now.Add(rewatchGrace))
	if b.rewatchUsers() != 0 {
		t.Errorf("%d users' records left after the grace", b.rewatchUsers())
	}
}

func heapInUse() int64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return int64(m.HeapAlloc)
}
