//go:build !unix

package backlog

func (w *Writer) tryWrite(b []byte) (int, error) { return w.tryWriteDeadline(b) }

func (w *Writer) writeOnce(uintptr) bool { return true }
