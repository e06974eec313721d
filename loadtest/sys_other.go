//go:build !linux

package main

import (
	"errors"
	"syscall"
	"time"
)

// preciseSleeper is time.Sleep where a precise one is not built.
type preciseSleeper struct{}

func newPreciseSleeper() preciseSleeper  { return preciseSleeper{} }
func (preciseSleeper) until(t time.Time) { time.Sleep(time.Until(t)) }
func (preciseSleeper) stop()             {}

// bindNoPort does nothing where IP_BIND_ADDRESS_NO_PORT does not exist.
func bindNoPort(network, address string, c syscall.RawConn) error { return nil }

func raiseNoFile() (soft, hard uint64, err error) {
	var r syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &r); err != nil {
		return 0, 0, err
	}
	r.Cur = r.Max
	err = syscall.Setrlimit(syscall.RLIMIT_NOFILE, &r)
	return r.Cur, r.Max, err
}

func childAttr() *syscall.SysProcAttr { return nil }

func renice(pid, nice int) error { return errors.New("renice: linux only") }
