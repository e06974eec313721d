package main

import (
	"context"
	"errors"
	"runtime"
	"sync"
	"time"
)

// dialersPerProc bounds a worker's dialer goroutines at this many per
// GOMAXPROCS. A dialer spends an attempt waiting for the server's answer
// to its handshake, not on its own CPU, and a reconnect storm is a herd of
// browsers each connecting at once: at 32 per processor a worker let 64
// attempts through at a time and smoothed the storm itself (no listen
// queue overflow where the herd overflowed it 3,754 times). At 1,024 a
// worker's 5,000 clients reconnect in two waves. Dialers exist only while
// attempts are queued, so an idle worker has none; a storm's handshake
// stacks are its garbage.
const dialersPerProc = 1024

var errWorkerClosed = errors.New("worker closed")

// dialQueue owns what runs a worker's connections between the ends of
// their sessions: the queue of connections due an attempt, the dialer
// goroutines that run the attempts (started as connections are queued, at
// most dialersPerProc×GOMAXPROCS, each leaving when the queue is empty),
// the backoff timers of connections waiting to reconnect, and, where there
// is no poller, the goroutine reading each established session. Once
// closed it starts none of them; wait returns when every one has ended.
// The zero value is an open queue.
type dialQueue struct {
	mu      sync.Mutex
	queue   []*conn // due an attempt, oldest first, each at most once (its backoff is taken once); guarded by mu
	running int     // dialer goroutines, guarded by mu
	closed  bool    // guarded by mu
	ctx     context.Context
	cancel  context.CancelFunc // ends dials in progress once closed; both made by context
	wg      sync.WaitGroup     // dialers, readers and armed timers; Add only under mu while open
}

// push queues c for an attempt and never blocks: the poller's loop pushes
// the connections whose stream ended. It reports false once q is closed.
func (q *dialQueue) push(c *conn) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed {
		return false
	}
	q.queue = append(q.queue, c)
	if q.running < dialersPerProc*runtime.GOMAXPROCS(0) {
		q.running++
		q.wg.Add(1)
		go q.dial()
	}
	return true
}

// dial runs queued attempts until the queue is empty.
func (q *dialQueue) dial() {
	defer q.wg.Done()
	for {
		q.mu.Lock()
		if len(q.queue) == 0 {
			q.running--
			q.mu.Unlock()
			return
		}
		c := q.queue[0]
		q.queue[0] = nil
		q.queue = q.queue[1:]
		q.mu.Unlock()
		c.attempt()
	}
}

// afterFunc calls f on a goroutine of its own after d, as time.AfterFunc
// does, unless the timer is stopped with stop first. It returns nil once q
// is closed.
func (q *dialQueue) afterFunc(d time.Duration, f func()) *time.Timer {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed {
		return nil
	}
	q.wg.Add(1)
	return time.AfterFunc(d, func() {
		defer q.wg.Done()
		f()
	})
}

// stop stops a timer of afterFunc and reports whether it did so before f
// started.
func (q *dialQueue) stop(t *time.Timer) bool {
	if !t.Stop() {
		return false
	}
	q.wg.Done()
	return true
}

// goRead runs read, a session's reader, on a goroutine of its own. It
// reports false once q is closed.
func (q *dialQueue) goRead(read func()) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed {
		return false
	}
	q.wg.Add(1)
	go func() {
		defer q.wg.Done()
		read()
	}()
	return true
}

// context is the dials' context, cancelled by close.
func (q *dialQueue) context() context.Context {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.ctx == nil {
		q.ctx, q.cancel = context.WithCancel(context.Background())
	}
	return q.ctx
}

// close stops q: no dialer, timer or reader starts from now on, dials in
// progress are cancelled, and the connections still queued end. It may be
// called more than once.
func (q *dialQueue) close() {
	q.context()
	q.mu.Lock()
	q.closed = true
	queued := q.queue
	q.queue = nil
	q.mu.Unlock()
	q.cancel()
	for _, c := range queued {
		c.finish(errWorkerClosed)
	}
}

// wait returns once every dialer, reader and timer has ended; the
// connections they ran must be closed.
func (q *dialQueue) wait() { q.wg.Wait() }
