package node

import "syscall"

// reservedFiles are the descriptors MaxConns leaves for everything but
// streams: Redis and PostgreSQL pools, Pub/Sub and stream readers, plain
// HTTP requests, the listener.
const reservedFiles = 1000

// maxConns is the limit of streams for a MaxConns: itself, or, for 0, the
// open-file limit less reservedFiles, so that a node refuses streams with 503 before
// accept(2) starts failing with EMFILE for everything. The Go runtime has
// already raised the soft limit to the hard one.
func maxConns(setting int) int {
	if setting > 0 {
		return setting
	}
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil || rl.Cur > 1<<30 {
		return 0 // unknown or practically unlimited
	}
	return max(int(rl.Cur)-reservedFiles, 100)
}
