package main

import (
	"sync"
	"sync/atomic"

	"github.com/HdrHistogram/hdrhistogram-go"
)

// phase is where deliveries are recorded while it is current. Histograms
// are sharded by connection to keep thousands of readers off one lock.
type phase struct {
	name   string
	shards [8]phaseShard
	// byNode is latency again, by the node that delivered it, of the
	// connections dialed before the latest since mark: coarser (two
	// significant digits) and not sharded, so a fleet's worth of them
	// stays small in every worker.
	byNode []nodeHist
	// wire is the bytes read from the servers' sockets while the phase
	// was current: what the deliveries cost on the wire, with their
	// framing and the keepalives beside them (read by the poller only).
	wire atomic.Int64
}

type nodeHist struct {
	mu sync.Mutex
	h  *hdrhistogram.Histogram
}

type phaseShard struct {
	mu          sync.Mutex
	latency     *hdrhistogram.Histogram
	byTransport [2]*hdrhistogram.Histogram // latency again, indexed by transportIndex
	connect     *hdrhistogram.Histogram
	deliveries  int64
	catchUp     int64
	connects    int64
	_           [24]byte // keep shards on separate cache lines
}

// transports names the index of phaseShard.byTransport.
var transports = [2]string{"sse", "ws"}

func transportIndex(ws bool) int {
	if ws {
		return 1
	}
	return 0
}

func (w *worker) setPhase(name string) {
	w.phaseMu.Lock()
	defer w.phaseMu.Unlock()
	if w.phases == nil {
		w.phases = map[string]*phase{}
	}
	p := w.phases[name]
	if p == nil {
		p = &phase{name: name, byNode: make([]nodeHist, len(w.urls))}
		for i := range p.byNode {
			p.byNode[i].h = newCoarseHist()
		}
		for i := range p.shards {
			p.shards[i].latency = newHist()
			p.shards[i].connect = newHist()
			for t := range p.shards[i].byTransport {
				p.shards[i].byTransport[t] = newHist()
			}
		}
		w.phases[name] = p
	}
	w.phase.Store(p)
}
