package main

import (
	"runtime"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// preciseSleeper sleeps to within tens of microseconds of a deadline. A Go
// timer due in under a millisecond waits for the runtime's poller, whose
// epoll_wait sleeps whole milliseconds: a schedule of 1 ms ticks fires up
// to a millisecond late, less so while the process is busy, so a server
// that answers its publisher faster would see its updates start later. A
// nanosleep on a thread of its own with the least timer slack does not.
type preciseSleeper struct{}

// newPreciseSleeper takes the calling goroutine's thread for the sleeps
// until stop.
func newPreciseSleeper() preciseSleeper {
	runtime.LockOSThread()
	unix.Prctl(unix.PR_SET_TIMERSLACK, 1, 0, 0, 0) // best effort: the default slack is 50 µs
	return preciseSleeper{}
}

func (preciseSleeper) until(t time.Time) {
	for d := time.Until(t); d > 0; d = time.Until(t) {
		ts := unix.NsecToTimespec(int64(d))
		if unix.Nanosleep(&ts, nil) == nil {
			return
		}
	}
}

// stop gives the thread back, with the default slack: an exiting
// goroutine's locked thread would end with it, but this one goes on.
func (preciseSleeper) stop() {
	unix.Prctl(unix.PR_SET_TIMERSLACK, 0, 0, 0, 0)
	runtime.UnlockOSThread()
}

// bindNoPort is a net.Dialer Control that sets IP_BIND_ADDRESS_NO_PORT, so
// binding to a source address leaves the port to connect(), which picks it
// per destination: tens of thousands of connections from one loopback
// address to one server do not run out of ephemeral ports.
func bindNoPort(network, address string, c syscall.RawConn) error {
	var serr error
	err := c.Control(func(fd uintptr) {
		serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_IP, unix.IP_BIND_ADDRESS_NO_PORT, 1)
	})
	if err != nil {
		return err
	}
	return serr
}

// raiseNoFile raises the soft RLIMIT_NOFILE to the hard limit. Calling
// Setrlimit also makes children started afterwards inherit the raised limit
// (Go otherwise restores the original soft limit in children).
func raiseNoFile() (soft, hard uint64, err error) {
	var r syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &r); err != nil {
		return 0, 0, err
	}
	r.Cur = r.Max
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &r); err != nil {
		return 0, 0, err
	}
	return r.Cur, r.Max, nil
}

// childAttr kills a child when the controller dies, however it dies.
func childAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}

// renice sets the scheduling priority of process pid: a negative nice
// puts it ahead of the run's other processes on a shared machine.
func renice(pid, nice int) error {
	return syscall.Setpriority(syscall.PRIO_PROCESS, pid, nice)
}
