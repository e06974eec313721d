package fanout

import (
	"context"
	"slices"
	"sync"
	"time"
)

// subTable is the tenant table both Redis buses keep: a reference count
// per tenant, Subscribe waiting for the first confirmation, and a linger
// before the last release unsubscribes. The buses embed it; its mutex also
// guards their own per-bus state.
type subTable struct {
	mu      sync.Mutex
	started bool
	closed  bool
	subs    map[string]*tenantSub // by tenant id

	linger time.Duration
	timers sync.WaitGroup // linger timers armed and not finished
	// onExpire unsubscribes a tenant whose linger ran out, if gen is still
	// its generation (see leave); the bus sets it.
	onExpire func(e *tenantSub, gen uint64)
}

// tenantSub is one tenant's subscription. Its fields are guarded by
// subTable.mu, except tenant and channel, which never change.
type tenantSub struct {
	tenant, channel string

	refs int
	// ready is closed at the first confirmation (confirmed is then true) or
	// when the subscription failed (err is then set). It is never reopened:
	// a later confirmation is a resubscription after a loss.
	ready     chan struct{}
	confirmed bool
	err       error
	// leaving is set while the tenant's unsubscribe is being written, and
	// closed once it was: a Subscribe waits for it and starts afresh, so a
	// subscribe and an unsubscribe of one channel never cross on the wire.
	leaving chan struct{}

	gen   uint64      // bumped whenever a linger timer is armed or cancelled
	timer *time.Timer // the linger timer, while refs == 0

	// ClusterBus only: where its SSUBSCRIBE was written (nil while
	// unplaced), whether that shard confirmed it, and the master that
	// dropped it with sunsubscribe, and when. With a TenantLossHandler:
	// whether its loss is open (lost, and the shard failure's error), and
	// whether the handler was told so (toldLost; changed only in a handler
	// call, see syncLoss).
	shard     *shard
	placed    bool
	movedFrom string
	movedAt   time.Time
	lost      bool
	lostErr   error
	toldLost  bool
}

// fail ends a subscription that was never confirmed, waking its waiters.
func (e *tenantSub) fail(err error) {
	if e.confirmed || e.err != nil {
		return
	}
	e.err = err
	close(e.ready)
}

// acquire takes a reference on tenant's subscription. The first reference
// creates it and calls first, outside the lock, to have it subscribed; it
// and every reference taken before the confirmation wait for it. If ctx
// ends first, the reference is dropped and ctx's error returned. A
// reference taken while the tenant lingers revives it; one taken while it
// is leaving waits and starts afresh.
func (s *subTable) acquire(ctx context.Context, tenant, channel string, first func(*tenantSub)) (release func(), err error) {
	for {
		s.mu.Lock()
		switch {
		case s.closed:
			s.mu.Unlock()
			return nil, ErrClosed
		case !s.started:
			s.mu.Unlock()
			return nil, errNotStarted
		}
		e := s.subs[tenant]
		if e != nil && e.leaving != nil {
			leaving := e.leaving
			s.mu.Unlock()
			select {
			case <-leaving:
				continue
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
		isFirst := e == nil
		if isFirst {
			e = &tenantSub{tenant: tenant, channel: channel, ready: make(chan struct{})}
			s.subs[tenant] = e
		} else if e.refs == 0 {
			s.stopLinger(e)
		}
		e.refs++
		s.mu.Unlock()

		var once sync.Once
		release = func() { once.Do(func() { s.release(e) }) }
		if isFirst {
			first(e)
		}
		select {
		case <-e.ready:
			s.mu.Lock()
			err := e.err
			s.mu.Unlock()
			if err != nil {
				return nil, err // a failed subscription holds no references
			}
			return release, nil
		case <-ctx.Done():
			release()
			return nil, ctx.Err()
		}
	}
}

// release drops a reference; the last one arms the linger timer, once the
// subscription is confirmed (an unconfirmed one is armed by its
// confirmation, so every subscribe's reply is read before its unsubscribe
// is sent).
func (s *subTable) release(e *tenantSub) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed || e.err != nil || s.subs[e.tenant] != e {
		return
	}
	e.refs--
	if e.refs == 0 && e.confirmed {
		s.armLinger(e)
	}
}

// confirmedNow records e's confirmation: the first closes ready (and arms the
// linger if every waiter gave up meanwhile); it reports whether e was
// confirmed before, i.e. this is a resubscription. s.mu is held.
func (s *subTable) confirmedNow(e *tenantSub) (again bool) {
	if e.confirmed {
		return true
	}
	e.confirmed = true
	close(e.ready)
	if e.refs == 0 && !s.closed {
		s.armLinger(e)
	}
	return false
}

// armLinger starts e's linger timer. s.mu is held and s is not closed.
func (s *subTable) armLinger(e *tenantSub) {
	e.gen++
	gen := e.gen
	s.timers.Add(1)
	e.timer = time.AfterFunc(s.linger, func() {
		defer s.timers.Done()
		s.onExpire(e, gen)
	})
}

// stopLinger cancels e's linger timer, if any. s.mu is held. A timer that
// already fired finds its generation stale and does nothing.
func (s *subTable) stopLinger(e *tenantSub) {
	if e.timer != nil && e.timer.Stop() {
		s.timers.Done()
	}
	e.timer = nil
	e.gen++
}

// leave marks a lingering tenant as leaving, if gen is still its linger's
// generation and nothing revived it; the caller then unsubscribes it and
// calls left.
func (s *subTable) leave(e *tenantSub, gen uint64) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed || s.subs[e.tenant] != e || e.gen != gen || e.refs > 0 {
		return false
	}
	e.timer = nil
	e.leaving = make(chan struct{})
	return true
}

// left removes a leaving tenant and wakes the Subscribes waiting for it.
func (s *subTable) left(e *tenantSub) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.subs[e.tenant] == e {
		delete(s.subs, e.tenant)
	}
	close(e.leaving)
}

// closeAll marks the table closed, stops every linger and fails every
// unconfirmed subscription with ErrClosed. It reports whether it was open.
// s.mu is held.
func (s *subTable) closeAll() bool {
	if s.closed {
		return false
	}
	s.closed = true
	for _, e := range s.subs {
		s.stopLinger(e)
		e.fail(ErrClosed)
	}
	return true
}

// subscribed returns, sorted, the tenants held: referenced or lingering,
// confirmed or awaiting confirmation.
func (s *subTable) subscribed() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	tenants := make([]string, 0, len(s.subs))
	for t, e := range s.subs {
		if e.leaving == nil && e.err == nil {
			tenants = append(tenants, t)
		}
	}
	slices.Sort(tenants)
	return tenants
}
