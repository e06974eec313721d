package stream

import (
	"context"
	"errors"
	"math/rand/v2"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pushd/pushd/stream/cursor"
)

// On Redis Cluster one XREAD cannot name streams of different slots, even
// when one master serves them all (Redis answers CROSSSLOT), and each
// tenant's stream has a slot of its own (its hash tag is the tenant). So a
// reader there keeps one single-key XREAD BLOCK in flight per stream, each
// on a connection of its own from its master's pool, bounded per master by
// Config.ClusterReads. A stream past the bound is polled, with the other
// streams past it, in a pipeline of non-blocking XREADs every Block. The
// reader's loop alone places, checks and delivers, as on a standalone
// Redis; the reads' goroutines only wait on Redis and hand back what came.

// blockRead is what one blocking read brought back.
type blockRead struct {
	tl   *tail
	gen  uint64 // tl.gen when the read began: a read of an earlier placement is dropped
	addr string // the master it is counted against in Tailer.blocking
	msgs []redis.XMessage
	err  error
}

// readStart is where a read of a tail begins: after last, of placement gen.
type readStart struct {
	tl   *tail
	gen  uint64
	last cursor.ID
}

// admit counts a blocking read of key against its master's bound; false
// when the master has ClusterReads in flight, or its master is not known.
func (t *Tailer) admit(key string) (addr string, ok bool) {
	m, err := t.xrd.(*redis.ClusterClient).MasterForKey(t.ctx, key)
	if err != nil {
		return "", false
	}
	addr = m.Options().Addr
	t.blockMu.Lock()
	defer t.blockMu.Unlock()
	if t.blocking[addr] >= t.cfg.ClusterReads {
		return "", false
	}
	t.blocking[addr]++
	return addr, true
}

func (t *Tailer) unadmit(addr string) {
	t.blockMu.Lock()
	defer t.blockMu.Unlock()
	if t.blocking[addr]--; t.blocking[addr] <= 0 {
		delete(t.blocking, addr)
	}
}

// block runs one XREAD BLOCK of tl's stream after from and hands the
// result to out. A MOVED or ASK reply (the slot moved, or its master was
// taken over while the read waited) is followed by the cluster client at
// once, on a connection to the new owner; a connection error comes back as
// the read's error.
func (r *reader) block(tl *tail, gen uint64, from cursor.ID, addr string, out chan<- blockRead) {
	t := r.t
	defer t.wg.Done()
	ctx, cancel := context.WithTimeout(t.ctx, t.cfg.Block+time.Second)
	res, err := t.xrd.XRead(ctx, &redis.XReadArgs{Streams: []string{tl.key, from.String()}, Count: t.cfg.Count, Block: t.cfg.Block}).Result()
	cancel()
	b := blockRead{tl: tl, gen: gen, addr: addr, err: err}
	if err == nil && len(res) > 0 {
		b.msgs = res[0].Messages
	}
	select {
	case out <- b:
	case <-t.ctx.Done():
	}
}

// sharded is run's loop on a cluster: the blocking reads in flight, the
// channel their results come back on, and when the streams past the
// bound are polled next. Only the reader's goroutine touches it.
type sharded struct {
	r        *reader
	tails    []*tail // the reader's, as of the loop's last scan
	inflight map[*tail]bool
	results  chan blockRead
	nextPoll time.Time
	backoff  time.Duration
}

// runSharded is run's loop on a cluster.
func (r *reader) runSharded() {
	l := &sharded{r: r, inflight: make(map[*tail]bool), results: make(chan blockRead)}
	l.run()
}

func (l *sharded) run() {
	r, t := l.r, l.r.t
	r.nextCheck = time.Now().Add(t.cfg.CheckInterval)
	for t.ctx.Err() == nil {
		l.tails = r.mine()
		ok := r.prepare(l.tails)
		polled := l.startReads()
		r.polled.Store(int64(len(polled)))
		if len(l.inflight) == 0 && len(polled) == 0 {
			r.lastOK.Store(time.Now().UnixNano()) // nothing to read is not a failure
			if !r.idle(ok) {
				return
			}
			continue
		}
		if len(polled) > 0 && !time.Now().Before(l.nextPoll) {
			if !l.pollPast(polled) {
				return
			}
			continue
		}
		wait := time.Until(r.nextCheck)
		if !ok {
			wait = maxBackoff // retry what failed
		}
		if len(polled) > 0 {
			wait = min(wait, time.Until(l.nextPoll))
		}
		if !l.await(max(wait, 0)) {
			return
		}
	}
}

// startReads starts a blocking read of every verified tail without one,
// as far as each master's bound allows, and returns the tails past it.
func (l *sharded) startReads() []readStart {
	t := l.r.t
	var starts []readStart
	t.mu.RLock()
	for _, tl := range l.tails {
		if tl.verified && !l.inflight[tl] {
			starts = append(starts, readStart{tl, tl.gen, tl.last})
		}
	}
	t.mu.RUnlock()
	var polled []readStart
	for _, s := range starts {
		if !l.start(s) {
			polled = append(polled, s)
		}
	}
	return polled
}

// start starts a blocking read from s unless its master has ClusterReads
// in flight; it reports whether it did.
func (l *sharded) start(s readStart) bool {
	t := l.r.t
	addr, ok := t.admit(s.tl.key)
	if !ok {
		return false
	}
	l.inflight[s.tl] = true
	t.wg.Add(1)
	go l.r.block(s.tl, s.gen, s.last, addr, l.results)
	return true
}

// pollPast reads the streams past the blocking bound, once per Block, and
// delivers what came. It reports false when the tailer closed.
func (l *sharded) pollPast(polled []readStart) bool {
	r, t := l.r, l.r.t
	l.nextPoll = time.Now().Add(t.cfg.Block)
	res, err := r.poll(polled)
	if t.ctx.Err() != nil {
		return false
	}
	if err != nil {
		return l.failed(err)
	}
	l.backoff = 0
	t.stats.reads.Add(1)
	if t.dials.Load() != r.dials {
		r.distrust(l.tails) // see run
		return true
	}
	r.lastOK.Store(time.Now().UnixNano())
	for i, s := range polled {
		if len(res[i]) > 0 && !r.deliverRead(s.tl, s.gen, res[i]) {
			l.nextPoll = time.Now().Add(minBackoff) // read again soon
		}
	}
	return true
}

// failed is the loop's answer to a failed read: every tail of the reader
// is checked before it is trusted again, the slot maps are reloaded at
// once (a master that died answers nothing), and the reader backs off. It
// reports false when the tailer closed.
func (l *sharded) failed(err error) bool {
	r, t := l.r, l.r.t
	t.stats.readErrors.Add(1)
	r.lost.Fail("stream read failed; checking the streams once Redis answers", err)
	r.distrust(l.tails)
	t.reloadTopology()
	l.backoff = min(max(2*l.backoff, minBackoff), maxBackoff)
	return r.sleep(l.backoff/2 + rand.N(l.backoff/2))
}

// await handles the blocking reads' results until the loop has more to do
// than start the next read of the tail that answered: wait passed (a check
// or a poll is due, or a retry), a tail was added, a read failed or ran on
// a new connection, or a read cannot be started. The loop's scan of every
// tail thus runs about once per wait, not once per read. It reports false
// when the tailer closed.
func (l *sharded) await(wait time.Duration) bool {
	r, t := l.r, l.r.t
	timer := time.NewTimer(wait)
	defer timer.Stop()
	for {
		select {
		case b := <-l.results:
			delete(l.inflight, b.tl)
			t.unadmit(b.addr)
			if t.ctx.Err() != nil {
				return false
			}
			if b.err != nil && !errors.Is(b.err, redis.Nil) {
				return l.failed(b.err)
			}
			l.backoff = 0
			t.stats.reads.Add(1)
			if t.dials.Load() != r.dials {
				// The read may have run on a new connection, to a Redis
				// that restarted empty or a promoted replica: check first;
				// the entries are read again.
				r.distrust(l.tails)
				return true
			}
			r.lastOK.Store(time.Now().UnixNano())
			if len(b.msgs) > 0 && !r.deliverRead(b.tl, b.gen, b.msgs) {
				return r.sleep(minBackoff) // the batch is read again: give the sources a moment
			}
			if !l.restart(b.tl) {
				return true
			}
		case <-r.wake:
			return true
		case <-timer.C:
			return true
		case <-t.ctx.Done():
			return false
		}
	}
}

// restart starts tl's next blocking read, after what was just delivered.
// A tail released meanwhile needs none. It reports false when the read
// could not be started (its master is at ClusterReads): the loop's scan
// then polls it.
func (l *sharded) restart(tl *tail) bool {
	t := l.r.t
	t.mu.RLock()
	s := readStart{tl, tl.gen, tl.last}
	live := tl.verified && t.tenants[tl.tenant] == tl
	t.mu.RUnlock()
	return !live || l.start(s)
}

// deliverRead delivers what a read of tl's placement gen brought, unless
// tl was released or placed anew since the read began (its entries may be
// of a stream the tail no longer follows). It reports whether the Target
// took them.
func (r *reader) deliverRead(tl *tail, gen uint64, msgs []redis.XMessage) bool {
	t := r.t
	t.mu.RLock()
	current := t.tenants[tl.tenant] == tl && tl.gen == gen
	t.mu.RUnlock()
	if !current {
		return true
	}
	return r.deliver(tl, msgs)
}

// poll reads the streams of tails past the blocking bound with a pipeline
// of single-key non-blocking XREADs, which the cluster client sends to each
// master in one round trip; res[i] is tails[i]'s entries. Any command's
// failure fails the poll.
func (r *reader) poll(tails []readStart) ([][]redis.XMessage, error) {
	t := r.t
	ctx, cancel := context.WithTimeout(t.ctx, t.cfg.Block+time.Second)
	defer cancel()
	pipe := t.xrd.Pipeline()
	cmds := make([]*redis.XStreamSliceCmd, len(tails))
	for i, s := range tails {
		cmds[i] = pipe.XRead(ctx, &redis.XReadArgs{Streams: []string{s.tl.key, s.last.String()}, Count: t.cfg.Count, Block: -1})
	}
	pipe.Exec(ctx) // each command's error is checked below
	res := make([][]redis.XMessage, len(tails))
	for i, c := range cmds {
		ss, err := c.Result()
		switch {
		case errors.Is(err, redis.Nil):
		case err != nil:
			return nil, err
		case len(ss) > 0:
			res[i] = ss[0].Messages
		}
	}
	return res, nil
}
