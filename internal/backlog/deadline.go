package backlog

import (
	"errors"
	"os"
	"time"
)

// tryBudget is how long tryWriteDeadline lets a write wait on a connection
// that has no descriptor to write to without blocking.
const tryBudget = 2 * time.Millisecond

// tryWriteDeadline is tryWrite for connections without a descriptor: a
// write under a short deadline, whose timeout means "the rest later".
func (w *Writer) tryWriteDeadline(b []byte) (int, error) {
	w.conn.SetWriteDeadline(time.Now().Add(tryBudget))
	n, err := w.conn.Write(b)
	if errors.Is(err, os.ErrDeadlineExceeded) {
		return n, nil
	}
	return n, err
}
