package fanout

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pushd/pushd/internal/episode"
	"github.com/pushd/pushd/internal/redisx"
	"github.com/pushd/pushd/keys"
	"github.com/pushd/pushd/snapshot"
)

// ErrClosed is returned by Subscribe on a bus that was closed, and to
// Subscribe calls still waiting for a confirmation when it closed.
var ErrClosed = errors.New("fanout: bus closed")

var (
	errNotStarted = errors.New("fanout: bus not started")
	errNoPong     = errors.New("fanout: pubsub connection silent: ping unanswered")
	errNoLiveness = errors.New("fanout: pubsub subscription silent: liveness message not heard back")
)

// Backoff after a failed receive, so a node does not spin while Redis is down
// and nodes do not redial in step after a restart.
const (
	minBackoff = 50 * time.Millisecond
	maxBackoff = 2 * time.Second
)

// malformedLogEvery rate-limits the debug log of dropped payloads.
const malformedLogEvery = 10 * time.Second

// RedisBus is the Bus of a node on Redis: one Pub/Sub connection, on which
// it subscribes the channel of each tenant its connections watch, counting
// references per tenant.
//
// The reading loop is the only reader of the connection. Subscribe,
// UNSUBSCRIBE after a linger, and the loop's own pings write to it from
// their goroutines; go-redis serializes the writes and does not hold its lock
// while the loop reads.
//
// go-redis reconnects on the next receive after a failure and sends SUBSCRIBE
// again for every channel it holds. A confirmation of a tenant that was
// confirmed before therefore means the subscription was lost and is back:
// the bus calls Handler.Resync for it. A notification heard for a tenant
// nobody references (lingering, or unsubscribed a moment ago) is delivered
// all the same; the handler ignores what nobody watches.
//
// Pings only prove that the connection answers. To prove that the
// subscription delivers, the bus also subscribes a channel of its own (before
// any tenant's, and for its whole life) and a liveness goroutine PUBLISHes
// on it through Client every LivenessInterval. When a PUBLISH Redis
// acknowledged stays unheard for LivenessTimeout while the connection was
// healthy, the liveness goroutine drops the connection; the reading loop then
// sees its receive fail, reports Lost, and go-redis redials.
type RedisBus struct {
	cfg    BusConfig // defaults applied
	log    *slog.Logger
	lost   *episode.Logger // the outages of the Pub/Sub connection
	ps     *redis.PubSub
	ctx    context.Context // done at Close; bounds the loop, dials and writes of the bus's own
	cancel context.CancelFunc
	done   chan struct{} // closed when the reading loop returns

	stats redisCounters

	// afterUnsubscribe, when set by a test, is called after a lingering
	// tenant's UNSUBSCRIBE was written (or failed).
	afterUnsubscribe func(tenantID string)
	// afterLivenessPublish and afterLivenessHeard, when set by a test before
	// Start, are called by the liveness goroutine after each PUBLISH, and by
	// the reading loop after each liveness message heard.
	afterLivenessPublish func(err error)
	afterLivenessHeard   func()

	// Liveness. liveChannel never changes; it is empty when the check is
	// disabled.
	liveChannel string
	liveReady   chan struct{} // closed once the loop wrote the liveness SUBSCRIBE (or failed to)
	liveDone    chan struct{} // closed when the liveness goroutine returns
	epoch       time.Time     // origin of since()
	// heardAt is since() when the loop last heard a liveness message or
	// restored the connection (its first successful receive after a
	// failure, or ever), and 0 while the connection is down or was dropped.
	// The loop sets it; a failure and a liveness drop clear it. The liveness
	// goroutine drops only a connection it saw healthy and unheard, with a
	// compare-and-swap: it never fires on a connection heard or restored
	// since it looked, nor again while the loop is down or redialing.
	heardAt atomic.Int64
	// dropMu makes a liveness drop (clearing heardAt, setting dropErr and
	// dropping the connection) one step for the reading loop, which takes
	// dropErr under it once it sees dropPending.
	dropMu      sync.Mutex
	dropErr     error       // guarded by dropMu
	dropPending atomic.Bool // dropErr is set

	// Owned by the reading loop.
	down bool // the last receive failed, and Lost was reported; cleared by the next success

	drops dropLog

	subTable // the tenants
}

type redisCounters struct {
	received, malformed, subscribes, unsubscribes, resyncs, failures atomic.Int64
	losses                                                           atomic.Int64
	livenessSent, livenessHeard, livenessFailures                    atomic.Int64
	malformedBy                                                      [len(malformedReasons)]atomic.Int64
}

// RedisStats are a RedisBus's counters since it was made.
type RedisStats struct {
	Received     int64            // messages heard, well-formed or not
	Malformed    int64            // messages dropped as malformed
	MalformedBy  map[string]int64 // Malformed by reason: channel, size, json, task_id, version, project_id, user_id
	Subscribes   int64            // SUBSCRIBE commands the bus sent (go-redis's resubscriptions excluded)
	Unsubscribes int64            // UNSUBSCRIBE commands the bus sent
	Resyncs      int64            // Handler.Resync calls
	Failures     int64            // failed receives and pings, and liveness drops (each outage counts at least one)
	Losses       int64            // outages: the subscription was lost (LossHandler.Lost), counted once until it is back

	LivenessSent     int64 // liveness PUBLISHes Redis acknowledged
	LivenessHeard    int64 // liveness messages heard back (never counted in Received)
	LivenessFailures int64 // liveness PUBLISHes that failed (expected while Redis is down)
}

var _ Bus = (*RedisBus)(nil)

// NewRedisBus returns a bus on cfg.Client, with a random liveness channel of
// its own. It does no I/O: the Pub/Sub connection is dialled by the reading
// loop that Start begins. It panics without a Client, or with a *redis.Ring.
func NewRedisBus(cfg BusConfig) *RedisBus {
	if cfg.Client == nil {
		panic("fanout: NewRedisBus: BusConfig.Client is required")
	}
	if _, ok := cfg.Client.(*redis.Ring); ok {
		panic("fanout: NewRedisBus cannot use a *redis.Ring as BusConfig.Client")
	}
	cfg = cfg.withDefaults()
	ctx, cancel := context.WithCancel(context.Background())
	log := cfg.Logger.With("component", "fanout")
	b := &RedisBus{
		cfg:       cfg,
		log:       log,
		lost:      episode.New(log, "pubsub connection still down"),
		ps:        cfg.Client.Subscribe(ctx), // no channel: no I/O yet
		ctx:       ctx,
		cancel:    cancel,
		done:      make(chan struct{}),
		liveReady: make(chan struct{}),
		liveDone:  make(chan struct{}),
		epoch:     time.Now(),
		subTable:  subTable{subs: make(map[string]*tenantSub), linger: cfg.Linger},
	}
	b.onExpire = b.expire
	if cfg.LivenessInterval > 0 {
		b.liveChannel = cfg.Names.Liveness(fmt.Sprintf("%016x", rand.Uint64()))
	} else {
		close(b.liveReady)
		close(b.liveDone)
	}
	return b
}

// Start begins the reading loop, delivering to h. It must be called once,
// before Subscribe; a second call panics. Start after Close does nothing.
func (b *RedisBus) Start(h Handler) {
	if h == nil {
		panic("fanout: Start with a nil Handler")
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.started {
		panic("fanout: RedisBus started twice")
	}
	if b.closed {
		return
	}
	b.started = true
	go b.run(h)
	if b.liveChannel != "" {
		go b.liveness()
	}
}

// Subscribe takes a reference on tenantID's notifications. The first
// reference sends SUBSCRIBE; it and every reference taken before the
// confirmation wait for it. If ctx ends first, the reference is dropped and
// ctx's error returned. A reference taken while the tenant lingers revives
// it without a new SUBSCRIBE.
//
// When Redis is down, Subscribe of a tenant not yet subscribed fails (or
// waits until ctx ends if the connection is dead but not yet known to be),
// while Subscribe of a tenant already subscribed succeeds at once: its
// Resync after the recovery covers the gap.
func (b *RedisBus) Subscribe(ctx context.Context, tenantID string) (release func(), err error) {
	if !snapshot.ValidID(tenantID) {
		return nil, fmt.Errorf("subscribe %q: %w", tenantID, snapshot.ErrInvalidID)
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if err := b.awaitLiveReady(ctx); err != nil {
		return nil, err
	}
	return b.acquire(ctx, tenantID, b.cfg.Names.Channel(tenantID), func(e *tenantSub) { b.sendSubscribe(ctx, e) })
}

// awaitLiveReady returns once the reading loop wrote the liveness SUBSCRIBE,
// so that it precedes every tenant's.
func (b *RedisBus) awaitLiveReady(ctx context.Context) error {
	select {
	case <-b.liveReady:
		return nil
	default:
	}
	b.mu.Lock()
	closed, started := b.closed, b.started
	b.mu.Unlock()
	switch {
	case closed:
		return ErrClosed
	case !started:
		return errNotStarted
	}
	select {
	case <-b.liveReady:
		return nil
	case <-b.ctx.Done():
		return ErrClosed
	case <-ctx.Done():
		return ctx.Err()
	}
}

// sendSubscribe writes e's SUBSCRIBE. On failure it fails e, so its waiters
// return the error, and removes it.
func (b *RedisBus) sendSubscribe(ctx context.Context, e *tenantSub) {
	wctx, cancel := b.writeContext(ctx)
	err := b.ps.Subscribe(wctx, e.channel)
	cancel()
	if err == nil {
		b.stats.subscribes.Add(1)
		return
	}
	b.mu.Lock()
	if e.confirmed || e.err != nil { // confirmed regardless, or closed meanwhile
		b.mu.Unlock()
		return
	}
	e.fail(fmt.Errorf("subscribe %s: %w", e.tenant, err))
	e.leaving = make(chan struct{})
	b.mu.Unlock()

	// go-redis keeps a channel whose SUBSCRIBE failed in the set it
	// subscribes again after a reconnect; take it out, so a tenant nobody
	// references is not subscribed behind the bus's back.
	b.ps.Unsubscribe(b.ctx, e.channel)

	b.mu.Lock()
	if b.subs[e.tenant] == e {
		delete(b.subs, e.tenant)
	}
	close(e.leaving)
	b.mu.Unlock()
}

// writeContext returns the context for a Pub/Sub write on behalf of a
// caller. go-redis uses a context's deadline as the write deadline, and a
// failed write makes it drop the connection: a caller's deadline that passes
// mid-write would cost every tenant a resubscription and a resync. So the
// context has no deadline (the client's WriteTimeout bounds the write); it is
// done when ctx or the bus is, which aborts a dial.
func (b *RedisBus) writeContext(ctx context.Context) (context.Context, context.CancelFunc) {
	wctx, cancel := context.WithCancel(noDeadline{ctx})
	stop := context.AfterFunc(b.ctx, cancel)
	return wctx, func() { stop(); cancel() }
}

// noDeadline is a context without its parent's deadline; it is still done
// when the parent is.
type noDeadline struct{ context.Context }

func (noDeadline) Deadline() (time.Time, bool) { return time.Time{}, false }

// expire unsubscribes a tenant whose linger ran out unreferenced.
func (b *RedisBus) expire(e *tenantSub, gen uint64) {
	if !b.leave(e, gen) {
		return
	}
	// On failure go-redis has already forgotten the channel, and the
	// connection it failed on is gone: nothing is left subscribed.
	if err := b.ps.Unsubscribe(b.ctx, e.channel); err != nil {
		b.log.Debug("unsubscribe failed", "tenant", e.tenant, "err", err)
	} else {
		b.stats.unsubscribes.Add(1)
	}
	b.left(e)
	if f := b.afterUnsubscribe; f != nil {
		f(e.tenant)
	}
}

// Close stops the reading loop, closes the Pub/Sub connection and waits for
// the loop, the liveness goroutine and any linger timer running. A liveness
// PUBLISH in flight is waited for; the client's timeouts bound it. Subscribe
// calls still waiting return ErrClosed. Close is idempotent.
func (b *RedisBus) Close() error {
	b.mu.Lock()
	if !b.closeAll() {
		b.mu.Unlock()
		return nil
	}
	started := b.started
	b.mu.Unlock()

	b.cancel() // aborts a dial the loop or a Subscribe is in
	err := b.ps.Close()
	if started {
		<-b.done
		<-b.liveDone
	}
	b.timers.Wait()
	if err != nil {
		return fmt.Errorf("close pubsub: %w", err)
	}
	return nil
}

// Stats returns the bus's counters.
func (b *RedisBus) Stats() RedisStats { return b.stats.load() }

func (c *redisCounters) load() RedisStats {
	s := RedisStats{
		Received:     c.received.Load(),
		Malformed:    c.malformed.Load(),
		MalformedBy:  make(map[string]int64, len(malformedReasons)),
		Subscribes:   c.subscribes.Load(),
		Unsubscribes: c.unsubscribes.Load(),
		Resyncs:      c.resyncs.Load(),
		Failures:     c.failures.Load(),
		Losses:       c.losses.Load(),

		LivenessSent:     c.livenessSent.Load(),
		LivenessHeard:    c.livenessHeard.Load(),
		LivenessFailures: c.livenessFailures.Load(),
	}
	for i, r := range malformedReasons {
		s.MalformedBy[r] = c.malformedBy[i].Load()
	}
	return s
}

// Subscribed returns, sorted, the tenants the bus holds a subscription for:
// referenced or lingering, confirmed or awaiting confirmation.
func (b *RedisBus) Subscribed() []string { return b.subscribed() }

// run is the reading loop: the only reader of the Pub/Sub connection.
func (b *RedisBus) run(h Handler) {
	defer close(b.done)
	if b.liveChannel != "" {
		// Before any tenant's SUBSCRIBE (Subscribe waits for liveReady). If
		// the write fails, go-redis still keeps the channel in the set it
		// subscribes after a redial; but it may already have redialed without
		// it, so make sure the next receive dials afresh.
		if err := b.ps.Subscribe(b.ctx, b.liveChannel); err != nil {
			b.log.Debug("liveness subscribe failed", "err", err)
			b.dropConn()
		}
		close(b.liveReady)
	}
	var (
		pinged  bool // a ping is unanswered and nothing was heard since
		backoff time.Duration
	)
	for {
		msg, err := b.ps.ReceiveTimeout(b.ctx, b.cfg.PingInterval)
		if b.ctx.Err() != nil {
			return
		}
		if b.dropPending.Load() {
			// The liveness goroutine dropped the connection. Whatever this
			// receive returned, the subscription was not trusted: a message
			// read before the drop, or on a connection dialled since without
			// a failure being seen, is dropped with its connection (a
			// confirmation comes again on the next one), so the outage is
			// reported, and ends, as any other.
			lerr := b.takeDrop()
			if err == nil {
				b.dropConn()
			}
			err = lerr
		}
		if err != nil {
			if err = probe(b.ctx, b.ps, err, &pinged); err == nil {
				continue
			}
			// The connection failed, or go-redis kept one that may be
			// unusable. Make sure it is replaced: the replacement subscribes
			// every channel again, so every tenant gets its Resync.
			pinged = false
			b.dropConn()
			b.failed(h, err)
			backoff = min(max(2*backoff, minBackoff), maxBackoff)
			if !b.sleep(backoff/2 + rand.N(backoff/2)) {
				return
			}
			continue
		}
		pinged, backoff = false, 0
		if b.heardAt.Load() == 0 {
			b.heardAt.Store(b.since()) // healthy: a fresh start for the liveness check
		}
		if b.down {
			b.down = false
			b.lost.OK("pubsub connection restored")
			if lh, ok := h.(LossHandler); ok {
				lh.Restored() // down implies Lost was reported
			}
		}
		switch m := msg.(type) {
		case *redis.Message:
			if b.liveChannel != "" && m.Channel == b.liveChannel {
				b.heard()
				continue
			}
			b.deliver(h, m)
		case *redis.Subscription:
			if m.Kind == "subscribe" && m.Channel != b.liveChannel {
				b.confirm(h, m.Channel)
			}
		case *redis.Pong:
		}
	}
}

// takeDrop returns the error of a liveness drop, once the drop is complete.
func (b *RedisBus) takeDrop() error {
	b.dropMu.Lock()
	defer b.dropMu.Unlock()
	err := b.dropErr
	b.dropErr = nil
	b.dropPending.Store(false)
	return err
}

// heard records a liveness message.
func (b *RedisBus) heard() {
	b.stats.livenessHeard.Add(1)
	b.heardAt.Store(b.since())
	if f := b.afterLivenessHeard; f != nil {
		f()
	}
}

// since returns the time since the bus was made, on the monotonic clock;
// never 0.
func (b *RedisBus) since() int64 { return max(int64(time.Since(b.epoch)), 1) }

// liveness is the liveness goroutine: it PUBLISHes on the bus's liveness
// channel every LivenessInterval (jittered), and drops a healthy connection
// on which a PUBLISH that Redis acknowledged stays unheard for
// LivenessTimeout. A PUBLISH that fails says nothing about the subscription
// (the pings watch the connection itself): it is counted, and starts no
// clock.
func (b *RedisBus) liveness() {
	defer close(b.liveDone)
	var (
		seq     uint64
		clock   livenessClock
		failing bool // the last PUBLISH failed
	)
	timeout := int64(b.cfg.LivenessTimeout)
	timer := time.NewTimer(livenessDelay(b.cfg.LivenessInterval))
	defer timer.Stop()
	for {
		select {
		case <-timer.C:
		case <-b.ctx.Done():
			return
		}
		heard := b.heardAt.Load()
		if clock.silent(heard, b.since(), timeout) {
			b.livenessLost(heard, fmt.Errorf("%w within %v", errNoLiveness, b.cfg.LivenessTimeout))
			clock = livenessClock{}
		}

		seq++
		start := b.since()
		ctx, cancel := context.WithTimeout(b.ctx, b.cfg.LivenessTimeout)
		err := b.cfg.Client.Publish(ctx, b.liveChannel, strconv.FormatUint(seq, 10)).Err()
		cancel()
		if b.ctx.Err() != nil {
			return
		}
		if err != nil {
			b.stats.livenessFailures.Add(1)
			if !failing {
				b.log.Debug("liveness publish failing", "err", err)
			}
		} else {
			b.stats.livenessSent.Add(1)
			clock.acked(start, b.since())
		}
		failing = err != nil
		if f := b.afterLivenessPublish; f != nil {
			f(err)
		}
		timer.Reset(livenessDelay(b.cfg.LivenessInterval))
	}
}

// livenessLost drops the connection, if nothing was heard since heard (a
// heardAt the caller loaded), for the reading loop to report err as the
// loss. The loop's receive fails as the connection is closed under it; if it
// was not reading, it finds dropPending at its next receive.
func (b *RedisBus) livenessLost(heard int64, err error) {
	b.dropMu.Lock()
	defer b.dropMu.Unlock()
	if !b.heardAt.CompareAndSwap(heard, 0) {
		return // heard or restored since, or down: the loop knows already
	}
	b.dropErr = err
	b.dropPending.Store(true)
	b.dropConn()
}

// dropConn makes go-redis close the Pub/Sub connection, if it has one, so
// the next receive dials a new one and subscribes every channel again.
func (b *RedisBus) dropConn() { redisx.ForceReconnect(b.ps) }

// failed records a failed receive; the first after a healthy period is
// logged and reported to h.
func (b *RedisBus) failed(h Handler, err error) {
	b.stats.failures.Add(1)
	b.heardAt.Store(0)
	b.lost.Fail("pubsub connection lost; resubscribing", err)
	if b.down {
		return
	}
	b.down = true
	b.stats.losses.Add(1)
	if lh, ok := h.(LossHandler); ok {
		lh.Lost(err)
	}
}

func (b *RedisBus) sleep(d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-b.ctx.Done():
		return false
	}
}

// confirm handles the confirmation of a channel's SUBSCRIBE.
func (b *RedisBus) confirm(h Handler, channel string) {
	tenant, ok := b.cfg.Names.TenantFromChannel(channel)
	if !ok {
		return
	}
	b.mu.Lock()
	e := b.subs[tenant]
	if e == nil || e.leaving != nil || e.err != nil {
		b.mu.Unlock() // a reply to a SUBSCRIBE since undone
		return
	}
	resync := b.confirmedNow(e)
	b.mu.Unlock()
	if resync {
		b.stats.resyncs.Add(1)
		b.log.Debug("resubscribed", "tenant", tenant)
		h.Resync(tenant)
	}
}

// deliver parses a message and hands it to h, or counts and drops it.
func (b *RedisBus) deliver(h Handler, m *redis.Message) {
	b.stats.received.Add(1)
	n, reason, err := parseMessage(b.cfg.Names, m)
	if err != nil {
		b.malformed(reason, m.Channel, err)
		return
	}
	h.Notify(n)
}

// parseMessage parses a message heard on a tenant's channel, saying why it
// is dropped if it is.
func parseMessage(names keys.Names, m *redis.Message) (snapshot.Notification, string, error) {
	tenant, ok := names.TenantFromChannel(m.Channel)
	if !ok || !snapshot.ValidID(tenant) {
		return snapshot.Notification{}, reasonChannel, fmt.Errorf("%w: channel", ErrMalformed)
	}
	if len(m.Payload) > MaxNotificationSize { // before copying it
		return snapshot.Notification{}, reasonSize, fmt.Errorf("%w: %d bytes", ErrMalformed, len(m.Payload))
	}
	return parseNotification(tenant, []byte(m.Payload))
}

// malformed counts and logs a dropped payload.
func (b *RedisBus) malformed(reason, channel string, err error) {
	b.drops.drop(b.log, &b.stats, reason, channel, err)
}
