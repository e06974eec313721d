//go:build !linux

package ws

import (
	"errors"

	"github.com/pushd/pushd/ws/internal/wire"
)

// poller parks nothing here: every connection keeps its reader.
type poller struct{}

func newPoller() (*poller, error) { return nil, errors.ErrUnsupported }

func (*poller) arm(*sink) error { return errors.ErrUnsupported }
func (*poller) forget(*sink)    {}
func (*poller) close()          {}

func (*sink) readNow([]byte) (int, error) { return 0, wire.ErrWouldBlock }
