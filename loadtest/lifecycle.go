package main

import (
	"errors"
	"math/rand/v2"
	"time"
)

// A connection's life is driven by events, not by a goroutine of its own.
// start queues it on its worker's dialQueue; a dialer runs one attempt
// (attempt: dial, handshake, the established stream handed to the poller,
// or where there is none to a reader of its own) and moves on. The end of
// the session, or of an attempt that never got a stream, comes back to
// ended on whatever goroutine saw it, often the poller's loop: it counts
// the end and queues the connection again, at once when a stream had been
// established, else when a backoff timer fires. close, wake and the timer
// meet under c.mu: whichever takes c.backoff first hands the connection on.

// start queues c's first attempt; first, if not nil, is called once with
// the outcome of that attempt.
func (c *conn) start(first func(error)) {
	c.first = first
	c.requeue()
}

// requeue hands c to a dialer; a closed worker ends it instead.
func (c *conn) requeue() {
	c.status.Store(int32(stateDialing))
	if !c.w.dialq.push(c) {
		c.finish(errWorkerClosed)
	}
}

// attempt runs one attempt on a dialer, up to handing the stream over;
// the session's end comes back to ended.
func (c *conn) attempt() {
	if c.isClosing() {
		c.finish(nil) // as a close during the dial reported it
		return
	}
	c.dialStart = time.Now().UnixNano()
	c.phys, c.gotFirst = 0, false
	if c.ws {
		c.sessionWS(c.ended)
	} else {
		c.sessionSSE(c.ended)
	}
}

// ended takes c back when a session or attempt has ended: established
// reports whether the server accepted it, err what ended it. It runs on
// the goroutine that saw the end, the poller's loop included, and never
// blocks.
func (c *conn) ended(established bool, err error) {
	c.reportFirst(err)
	if c.isClosing() {
		c.status.Store(int32(stateClosed))
		return
	}
	c.w.countErr(errKind(err, established))
	c.w.reconnects.Add(1)
	switch {
	case errors.Is(err, errPollerClosed) || errors.Is(err, errWorkerClosed):
		c.finish(err) // the worker is shutting down: no stream can be read
	case established:
		c.retries = 0 // the stream ended: reconnect at once
		c.requeue()
	default:
		d := retryDelay(err, c.retries)
		c.retries++
		c.retryAfter(d)
	}
}

// retryDelay is the wait after the nth attempt in a row (from 0) that got
// no stream and ended with err. A refusal that names its wait is retried
// after it, as pushd.js does, spread by a quarter: retrying sooner only
// meets the same refusal, and a herd of clients that does keeps the
// limit's store busy refusing them. Anything else backs off.
func retryDelay(err error, n int) time.Duration {
	if se := (statusError{}); errors.As(err, &se) && se.retryAfter > 0 {
		return se.retryAfter + rand.N(se.retryAfter/4+1)
	}
	return backoffDelay(n)
}

// backoffDelay is the wait after the nth attempt in a row that got no
// stream (from 0), pushd.js's: full jitter between 0 and 500 ms doubling
// up to 30 s. A herd of clients that retries faster than real ones does
// not measure the fleet: 250,000 clients retrying within a second kept
// two cores too busy to accept any of them.
func backoffDelay(n int) time.Duration {
	return rand.N(min(500*time.Millisecond<<min(n, 6), 30*time.Second) + 1)
}

// retryAfter queues c again after d, unless close or a wake comes first.
func (c *conn) retryAfter(d time.Duration) {
	c.status.Store(int32(stateWaiting))
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closing || !c.armLocked(d) {
		c.status.Store(int32(stateClosed))
	}
}

// armLocked arms c's backoff timer, with c.mu held, and reports false when
// the worker is closed. The timer queues c only if it is still c's when it
// fires: close and wake take it first.
func (c *conn) armLocked(d time.Duration) bool {
	var t *time.Timer
	t = c.w.dialq.afterFunc(d, func() {
		c.mu.Lock()
		mine := c.backoff == t
		if mine {
			c.backoff = nil
		}
		c.mu.Unlock()
		if mine {
			c.requeue()
		}
	})
	c.backoff = t
	return t != nil
}

// wake ends c's backoff, if it waits: it is queued after its wake jitter,
// or at once.
func (c *conn) wake() {
	c.mu.Lock()
	t := c.backoff
	if t == nil || !c.w.dialq.stop(t) {
		c.mu.Unlock()
		return // not waiting, or the timer has fired and queues it
	}
	c.backoff = nil
	if j := c.wakeJitter.Load(); j > 0 {
		if !c.armLocked(time.Duration(j)) {
			c.status.Store(int32(stateClosed))
		}
		c.mu.Unlock()
		return
	}
	c.mu.Unlock()
	c.requeue()
}

// close ends the client for good, in any state: an attempt ends, a
// session's end does not queue it again, a dialer drops it, and its
// backoff timer is stopped.
func (c *conn) close() {
	c.mu.Lock()
	c.closing = true
	cl, t := c.closer, c.backoff
	c.closer, c.backoff = nil, nil
	c.mu.Unlock()
	if cl != nil {
		cl.Close()
	}
	if t != nil {
		c.w.dialq.stop(t) // if it has fired, it finds the timer no longer c's
		c.status.Store(int32(stateClosed))
	}
	c.w.removeConn(c)
}

// finish ends c without another attempt; whoever runs c calls it.
func (c *conn) finish(err error) {
	c.reportFirst(err)
	c.status.Store(int32(stateClosed))
}

// reportFirst calls first with the first attempt's outcome, once.
func (c *conn) reportFirst(err error) {
	if f := c.first; f != nil {
		c.first = nil
		f(err)
	}
}
