package main

import "syscall"

// reservedFiles are the descriptors --max-conns leaves for everything but
// streams: Redis and PostgreSQL pools, Pub/Sub and stream readers, plain
// HTTP requests, the listener.
const reservedFiles = 1000

// maxConns is the --max-conns to use: the flag's, or, for 0, the open-file
// limit less reservedFiles, so that a node refuses streams with 503 before
// accept(2) starts failing with EMFILE for everything. The Go runtime has
// already raised the soft limit to the hard one.
func maxConns(flag int) int {
	if flag > 0 {
		return flag
	}
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil || rl.Cur > 1<<30 {
		return 0 // unknown or practically unlimited
	}
	return max(int(rl.Cur)-reservedFiles, 100)
}
