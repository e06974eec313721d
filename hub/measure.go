package hub

import (
	"slices"
	"time"
)

// Transport is the protocol that carries a connection. The transports set
// it in the Principal they open a connection with, so the hub can count
// connections and writes per protocol.
type Transport uint8

// Transports a connection can have.
const (
	TransportUnknown   Transport = iota // opened by neither transport (tests, tools)
	TransportSSE                        // EventSource
	TransportWebSocket                  // WebSocket, pushd.v1
	NumTransports                       // the number of Transports, for arrays indexed by them
)

// String is the transport's metric label.
func (t Transport) String() string {
	switch t {
	case TransportSSE:
		return "sse"
	case TransportWebSocket:
		return "websocket"
	}
	return "unknown"
}

// Plan labels of connections. Plans come from signed tokens, but a metric
// label takes its values from configured sets only (Config.Plans), never
// from what a token says: any other plan counts as PlanOther.
const (
	PlanNone  = "none"  // the token stated no plan
	PlanOther = "other" // a plan not configured
)

// ConnCount is how many open connections share a transport and plan.
type ConnCount struct {
	Transport Transport
	Plan      string
	N         int
}

// connClass is what connections are counted by.
type connClass struct {
	transport Transport
	plan      string
}

// ConnCounts returns the open connections by transport and plan, in no
// particular order.
func (h *Hub) ConnCounts() []ConnCount {
	h.mu.RLock()
	defer h.mu.RUnlock()
	out := make([]ConnCount, 0, len(h.classes))
	for k, n := range h.classes {
		out = append(out, ConnCount{Transport: k.transport, Plan: k.plan, N: n})
	}
	return out
}

// classLocked picks the plan label of a connection of p, counts its class
// in and returns the label. h.mu is held for writing.
func (h *Hub) classLocked(p Principal) string {
	plan := p.Plan
	if plan == "" {
		plan = PlanNone
	}
	if plan != PlanNone && !slices.Contains(h.cfg.Plans, plan) {
		plan = PlanOther
	}
	k := connClass{p.Transport, plan}
	h.classes[k]++
	return plan
}

// unclassLocked counts c's class out. h.mu is held for writing.
func (h *Hub) unclassLocked(k connClass) {
	if h.classes[k]--; h.classes[k] <= 0 {
		delete(h.classes, k)
	}
}

// news says how a snapshot came to be offered to a connection, for the
// delivery histograms. The zero value is the initial state of a
// subscription, which neither measures: its age is the task's, not the
// delivery path's.
type news struct {
	// heard is when the node heard the notification that led to the offer
	// (Unix ns); 0 when no notification did (a poll, a stream entry).
	heard int64
	// live marks a change the node learned of after the subscription (a
	// notification, a poll, a stream entry): its write measures staleness.
	live bool
	// reread marks a task's current state read again (a repair round, a
	// resync, a poll) rather than news of a change: a resumed connection
	// may take an old one for a version its client holds
	// (Conn.offerTracked).
	reread bool
}

// Bucket bounds of the hub's histograms.
var (
	// notifyToWriteBounds bound the time from hearing a notification to
	// writing the snapshot it announced, and each stage of it (waiting for
	// a dispatcher, the read): a Redis read and a writer's turn, so tens to
	// hundreds of microseconds on a quiet node, milliseconds unless writers
	// or sources are starved. The fine bounds below a millisecond are what
	// tells a wake-up from a round trip.
	notifyToWriteBounds = [...]time.Duration{
		25 * time.Microsecond, 50 * time.Microsecond, 100 * time.Microsecond, 150 * time.Microsecond,
		200 * time.Microsecond, 300 * time.Microsecond, 500 * time.Microsecond, 750 * time.Microsecond,
		time.Millisecond, 2500 * time.Microsecond,
		5 * time.Millisecond, 10 * time.Millisecond, 25 * time.Millisecond, 50 * time.Millisecond,
		100 * time.Millisecond, 250 * time.Millisecond, 500 * time.Millisecond, time.Second,
		2500 * time.Millisecond, 5 * time.Second, 10 * time.Second,
	}
	// stalenessBounds bound the time from a snapshot's updated_at to its
	// write: the whole pipeline in push mode (tens of milliseconds), the
	// poll interval in polling mode (seconds), longer when a notification
	// was lost and the liveness check or a stream closed the gap.
	stalenessBounds = [...]time.Duration{
		5 * time.Millisecond, 10 * time.Millisecond, 25 * time.Millisecond, 50 * time.Millisecond,
		100 * time.Millisecond, 250 * time.Millisecond, 500 * time.Millisecond, time.Second,
		2500 * time.Millisecond, 5 * time.Second, 10 * time.Second, 30 * time.Second,
		time.Minute, 2 * time.Minute, 5 * time.Minute,
	}
)
