package main

// movedReport is a worker's connections that received a task event on a
// physical connection dialed after the since mark, and the longest wait
// for the first of them after the moved command's RefNs.
type movedReport struct {
	Conns int   `json:"conns"`
	MaxNs int64 `json:"max_ns"`
}

func (w *worker) moved(ref int64) *movedReport {
	r := &movedReport{}
	for _, c := range w.snapshotConns() {
		if at := c.back.Load(); at != 0 {
			r.Conns++
			r.MaxNs = max(r.MaxNs, at-ref)
		}
	}
	return r
}
