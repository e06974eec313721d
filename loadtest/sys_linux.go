package main

import (
	"syscall"

	"golang.org/x/sys/unix"
)

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
