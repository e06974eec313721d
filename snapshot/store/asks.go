package store

import (
	"context"
	"fmt"
	"slices"
	"sync"

	"github.com/pushd/pushd/snapshot"
)

// A herd of new connections (a lost node's clients, a deploy's) each
// reading its task's snapshot would cost the node a Redis round trip
// apiece, each queued for one of the pool's connections ahead of the
// deliveries' reads. Callers' Redis reads are gathered instead: while one
// MGET of them is in flight the next callers' reads queue, and the next
// MGET carries them all. One read alone goes out at once.

// maxAsks is the most tasks one MGET of callers' reads asks for.
const maxAsks = 256

// redisAsk is one caller's read of a task in the queue, and its answer.
type redisAsk struct {
	id           string
	checkMissing bool          // the negative-cache marker is read too
	done         chan struct{} // closed once the answer is set
	snap         *snapshot.Snapshot
	missing      bool
	err          error
}

// redisAsks is the queue of callers' reads waiting for the next MGET.
type redisAsks struct {
	mu       sync.Mutex
	queue    []*redisAsk
	draining bool // drainAsks runs
	reading  int  // asks in the MGET in flight
}

// askRedis is readRedis for a caller that can give up: its read shares an
// MGET with the other callers' reads of the moment. A read that waits out
// its share of the fetch timeout in the queue is errPoolWait, as one
// waiting for a pooled connection: the node was busy, not Redis.
func (s *Store) askRedis(ctx context.Context, id string, checkMissing bool) (*snapshot.Snapshot, bool, error) {
	if _, usable := s.redisBreaker(ctx, s.names.Snapshot(id)); !usable {
		s.stats.redisSkipped.Add(1)
		return nil, false, errRedisBackoff
	}
	ctx, cancel := context.WithTimeout(ctx, s.cfg.FetchTimeout/redisTimeoutShare)
	defer cancel()
	a := &redisAsk{id: id, checkMissing: checkMissing, done: make(chan struct{})}
	q := &s.asks
	q.mu.Lock()
	q.queue = append(q.queue, a)
	start := !q.draining
	q.draining = true
	q.mu.Unlock()
	if start {
		go s.drainAsks()
	}
	select {
	case <-a.done:
	case <-ctx.Done():
		if q.withdraw(a) {
			s.stats.redisPoolWaits.Add(1)
			return nil, false, fmt.Errorf("redis get %s: %w", id, errPoolWait)
		}
		<-a.done // in the MGET in flight, which its own deadline ends
	}
	return a.snap, a.missing, a.err
}

// withdraw takes a out of the queue, unless an MGET already carries it,
// and reports whether it did.
func (q *redisAsks) withdraw(a *redisAsk) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	i := slices.Index(q.queue, a)
	if i < 0 {
		return false
	}
	q.queue = slices.Delete(q.queue, i, i+1)
	return true
}

// drainAsks reads the queued asks, an MGET at a time, until none is left.
// The first ask of an empty queue starts it; it ends with the queue.
func (s *Store) drainAsks() {
	q := &s.asks
	for {
		q.mu.Lock()
		n := min(len(q.queue), maxAsks)
		batch := q.queue[:n:n]
		if q.queue = q.queue[n:]; len(q.queue) == 0 {
			q.queue = nil
		}
		q.reading = n
		q.draining = n > 0
		q.mu.Unlock()
		if n == 0 {
			return
		}
		s.readAsks(batch)
	}
}

// readAsks reads batch with one MGET (on Cluster, a pipeline of GETs by
// master) and answers each ask.
func (s *Store) readAsks(batch []*redisAsk) {
	defer func() {
		for _, a := range batch {
			close(a.done)
		}
	}()
	fail := func(err error) {
		for _, a := range batch {
			a.err = fmt.Errorf("redis get %s: %w", a.id, err)
		}
	}
	if !s.enter() {
		fail(errClosed)
		return
	}
	defer s.inflight.Done()
	ctx, cancel := context.WithTimeout(context.Background(), s.cfg.FetchTimeout/redisTimeoutShare)
	defer cancel()
	names := make([]string, 0, 2*len(batch))
	for _, a := range batch {
		names = append(names, s.names.Snapshot(a.id))
		if a.checkMissing {
			names = append(names, s.names.NotFound(a.id)) // in the snapshot's slot
		}
	}
	vals, err := s.getKeys(ctx, names)
	if vals == nil {
		fail(err)
		return
	}
	for _, a := range batch {
		v := vals[0]
		vals = vals[1:]
		var marker any
		if a.checkMissing {
			marker, vals = vals[0], vals[1:]
		}
		if e, ok := v.(error); ok {
			a.err = fmt.Errorf("redis get %s: %w", a.id, e)
			continue
		}
		if str, ok := v.(string); ok {
			snap, err := snapshot.Parse([]byte(str))
			if err == nil && snap.TaskID == a.id {
				snap.Origin = snapshot.OriginRedis
				s.stats.redisHits.Add(1)
				a.snap = snap
				continue
			}
			s.log.Debug("snapshot: undecodable snapshot in redis", "task_id", a.id, "err", err)
		}
		s.stats.redisMisses.Add(1)
		_, a.missing = marker.(string) // an error reading it only costs a PostgreSQL query
	}
}
