package main

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/procfs"
)

// postgresCPU is the CPU time, in clock ticks, of the PostgreSQL server
// the run uses when it runs on this machine: its postmaster's own, its
// exited backends' (which the postmaster reaped) and its live children's.
// The server is shared with whatever else runs, which during a run is
// nothing of the tests'. -1 when it cannot be read (another machine, no
// right to its data directory).
func postgresCPU(ctx context.Context, pool *pgxpool.Pool) int64 {
	var dir string
	if err := pool.QueryRow(ctx, "SHOW data_directory").Scan(&dir); err != nil {
		return -1
	}
	b, err := os.ReadFile(filepath.Join(dir, "postmaster.pid"))
	if err != nil {
		return -1
	}
	first, _, _ := strings.Cut(string(b), "\n")
	pid, err := strconv.Atoi(strings.TrimSpace(first))
	if err != nil {
		return -1
	}
	fs, err := procfs.NewDefaultFS()
	if err != nil {
		return -1
	}
	procs, err := fs.AllProcs()
	if err != nil {
		return -1
	}
	var ticks int64
	for _, p := range procs {
		st, err := p.Stat()
		switch {
		case err != nil:
		case p.PID == pid:
			ticks += int64(st.UTime+st.STime) + int64(st.CUTime+st.CSTime)
		case st.PPID == pid:
			ticks += int64(st.UTime + st.STime)
		}
	}
	return ticks
}
