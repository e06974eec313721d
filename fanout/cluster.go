package fanout

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"

	"github.com/pushd/pushd/internal/episode"
	"github.com/pushd/pushd/internal/redisx"
	"github.com/pushd/pushd/keys"
	"github.com/pushd/pushd/snapshot"
)

// errLivenessMoved replaces a shard whose liveness channel's slot left its
// master.
var errLivenessMoved = errors.New("fanout: the shard's liveness slot moved")

// ClusterConfig configures a ClusterBus. Only Client is required.
type ClusterConfig struct {
	// Client is the node's cluster client: the bus asks it which master
	// owns a channel's slot, and reloads its slot map when it moved.
	Client *redis.ClusterClient
	// Names spells the tenant channels. The zero value uses the names of
	// docs/DESIGN.md, "Key names".
	Names keys.Names
	// Linger is how long an unreferenced tenant stays subscribed. Zero means 2s.
	Linger time.Duration
	// PingInterval is how long a shard connection may stay silent before
	// the bus pings it; a ping unanswered one interval later condemns the
	// connection. Zero means 5s.
	PingInterval time.Duration
	// CheckInterval is how often the bus reloads the slot map and moves a
	// tenant whose slot changed master without the bus being told (a
	// master that lost its slots usually says so with sunsubscribe, and a
	// dead one drops its connections). Zero means 5s.
	CheckInterval time.Duration
	// LivenessInterval is how often the bus SPUBLISHes, straight to each
	// shard's master, on a channel of that shard's own (in a slot the master
	// serves) and expects to hear it back: proof that the subscription
	// delivers, where a ping proves only that the connection answers. Zero
	// means 1s; negative disables the check.
	LivenessInterval time.Duration
	// LivenessTimeout is how long a shard may go without hearing a liveness
	// message its master acknowledged before the bus replaces it and reports
	// Lost. Zero means 3 × LivenessInterval.
	LivenessTimeout time.Duration
	// Logger receives the bus's logs. Nil means slog.Default().
	Logger *slog.Logger
}

func (c ClusterConfig) withDefaults() ClusterConfig {
	if c.Linger <= 0 {
		c.Linger = 2 * time.Second
	}
	if c.PingInterval <= 0 {
		c.PingInterval = 5 * time.Second
	}
	if c.CheckInterval <= 0 {
		c.CheckInterval = 5 * time.Second
	}
	if c.LivenessInterval == 0 {
		c.LivenessInterval = time.Second
	}
	if c.LivenessInterval > 0 && c.LivenessTimeout <= 0 {
		c.LivenessTimeout = 3 * c.LivenessInterval
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

// maxPlaceBackoff bounds the placer's retries while channels are unplaced:
// a failover takes a cluster a second or two, and every retry costs only a
// slot-map lookup and a dial.
const maxPlaceBackoff = 500 * time.Millisecond

// movedGrace is how long the bus waits for the client's slot map to show
// the new owner of a slot whose master dropped a subscription, before it
// believes the old map (the slot may have come back).
const movedGrace = 2 * time.Second

// ClusterBus is the Bus of a node on Redis Cluster: sharded Pub/Sub
// (SSUBSCRIBE), one connection per shard master, each tenant's channel
// subscribed on the master that owns its slot.
//
// go-redis's PubSub resubscribes every shard channel it holds in one
// SSUBSCRIBE when it reconnects, and Redis refuses an SSUBSCRIBE across
// slots with CROSSSLOT. So the bus never lets go-redis reconnect: each shard
// connection (a shard) has a dialer that dials once, and the bus replaces a
// shard that failed with a new one, on which it subscribes each channel with
// an SSUBSCRIBE of its own.
//
// One goroutine, the placer, decides where channels are subscribed: it
// asks the cluster client which master owns each unplaced channel and writes
// the SSUBSCRIBE. A shard's reader hears messages and replies. A
// confirmation of a tenant confirmed before (on this shard or another) is a
// resubscription: Handler.Resync follows. Channels become unplaced when
//
//   - their shard's connection fails or goes silent: the placer reloads the
//     slot map and subscribes them again, on the replica promoted meanwhile
//     if the master died;
//   - the master sends sunsubscribe: their slot migrated;
//   - their shard answers a command with an error (MOVED while a slot
//     migrates): the shard is replaced, since the reply does not say which
//     channel it is about;
//   - the placer's periodic check finds their slot owned by another master.
//
// Each shard also subscribes a liveness channel of its own, in a slot its
// master serves, on which the bus SPUBLISHes every LivenessInterval; a
// shard that stops hearing it is replaced as if its connection had failed.
//
// A connection failure of a shard holding confirmed tenants reports Lost
// (once per outage); Restored follows when every such tenant is subscribed
// again, and each one's Resync when its confirmation arrives. Handler calls
// are made one at a time.
type ClusterBus struct {
	cfg    ClusterConfig // defaults applied
	log    *slog.Logger
	lost   *episode.Logger // the outages: from Lost to Restored
	ctx    context.Context // done at Close
	cancel context.CancelFunc
	kick   chan struct{} // wakes the placer; buffered
	wg     sync.WaitGroup
	hmu    sync.Mutex // serializes Handler calls
	stats  redisCounters
	epoch  time.Time // origin of since()

	// dialShard, when set by a test before Start, dials the shard
	// connections instead of the master client's dialer.
	dialShard func(ctx context.Context, network, addr string) (net.Conn, error)

	drops dropLog

	subTable                   // its mutex guards the fields below and the subscriptions' placement
	h        Handler           // set by Start, before the goroutines that call it
	shards   map[string]*shard // the live shard of each master address
	outage   bool              // Lost was reported, Restored not yet
	// heldResyncs are the tenants confirmed again during an outage, held
	// once each however often their shard flaps, so their Resyncs follow
	// Restored as LossHandler orders them.
	heldResyncs map[string]struct{}
}

// shard is one connection to a master, with its own client whose dialer
// dials once: when the connection fails, go-redis's redial (which would
// resubscribe across slots) fails at once, and the bus makes a new shard.
type shard struct {
	addr    string
	client  *redis.Client
	ps      *redis.PubSub
	retired atomic.Bool // the bus gave up on it; its reader returns quietly

	// node is the cluster client's client of this master: liveness
	// SPUBLISHes go to it directly, so a liveness slot that migrated answers
	// MOVED instead of being followed to another master. live is the
	// shard's liveness channel, "" when none was found in the master's
	// slots. heardAt is since() when the reader last heard it (0: never).
	node    *redis.Client
	live    string
	heardAt atomic.Int64
}

var _ Bus = (*ClusterBus)(nil)

// NewClusterBus returns a bus on cfg.Client. It does no I/O.
func NewClusterBus(cfg ClusterConfig) *ClusterBus {
	if cfg.Client == nil {
		panic("fanout: ClusterConfig.Client is required")
	}
	cfg = cfg.withDefaults()
	ctx, cancel := context.WithCancel(context.Background())
	log := cfg.Logger.With("component", "fanout")
	b := &ClusterBus{
		cfg:      cfg,
		log:      log,
		lost:     episode.New(log, "sharded pubsub still down"),
		ctx:      ctx,
		cancel:   cancel,
		kick:     make(chan struct{}, 1),
		epoch:    time.Now(),
		subTable: subTable{subs: make(map[string]*tenantSub), linger: cfg.Linger},
		shards:   make(map[string]*shard),
	}
	b.onExpire = b.expire
	return b
}

// Start begins delivering to h. It must be called once, before Subscribe;
// a second call panics. Start after Close does nothing.
func (b *ClusterBus) Start(h Handler) {
	if h == nil {
		panic("fanout: Start with a nil Handler")
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.started {
		panic("fanout: ClusterBus started twice")
	}
	if b.closed {
		return
	}
	b.started, b.h = true, h
	b.wg.Add(1)
	go b.placer()
	if b.cfg.LivenessInterval > 0 {
		b.wg.Add(1)
		go b.liveness()
	}
}

// Subscribe takes a reference on tenantID's notifications and returns once
// its channel is subscribed on the master owning its slot. A tenant that
// cannot be placed (no master known for its slot, or the write failed)
// fails; one already subscribed succeeds at once, even while its shard is
// being replaced: its Resync covers the gap.
func (b *ClusterBus) Subscribe(ctx context.Context, tenantID string) (release func(), err error) {
	if !snapshot.ValidID(tenantID) {
		return nil, fmt.Errorf("subscribe %q: %w", tenantID, snapshot.ErrInvalidID)
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return b.acquire(ctx, tenantID, b.cfg.Names.Channel(tenantID), func(*tenantSub) { b.wake() })
}

// expire unsubscribes a tenant whose linger ran out unreferenced.
func (b *ClusterBus) expire(e *tenantSub, gen uint64) {
	if !b.leave(e, gen) {
		return
	}
	b.mu.Lock()
	sh := e.shard
	e.shard, e.placed = nil, false
	b.mu.Unlock()
	// A failed write leaves nothing subscribed: the shard's connection is
	// gone, and it is never redialed.
	if sh != nil && !sh.retired.Load() {
		if err := sh.ps.SUnsubscribe(b.ctx, e.channel); err != nil {
			b.log.Debug("sunsubscribe failed", "tenant", e.tenant, "err", err)
		} else {
			b.stats.unsubscribes.Add(1)
		}
	}
	b.left(e)
	b.wake() // the shard may have nothing left to hold
}

// Close stops the placer and every shard's reader, closes their
// connections and waits for them and for any linger timer running.
// Subscribe calls still waiting return ErrClosed. Close is idempotent.
func (b *ClusterBus) Close() error {
	b.mu.Lock()
	if !b.closeAll() {
		b.mu.Unlock()
		return nil
	}
	shards := b.shards
	b.shards = nil
	b.mu.Unlock()

	b.cancel()
	for _, sh := range shards {
		sh.close()
	}
	b.wg.Wait()
	b.timers.Wait()
	return nil
}

// Stats returns the bus's counters; the liveness ones stay zero.
func (b *ClusterBus) Stats() RedisStats { return b.stats.load() }

// Subscribed returns, sorted, the tenants the bus holds a subscription for.
func (b *ClusterBus) Subscribed() []string { return b.subscribed() }

// Shards returns, sorted, the master addresses the bus holds a connection
// to.
func (b *ClusterBus) Shards() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	addrs := make([]string, 0, len(b.shards))
	for a := range b.shards {
		addrs = append(addrs, a)
	}
	slices.Sort(addrs)
	return addrs
}

// wake makes the placer run soon.
func (b *ClusterBus) wake() {
	select {
	case b.kick <- struct{}{}:
	default:
	}
}

// placer subscribes unplaced channels where their slots live, checks every
// CheckInterval that each placed channel still is, and retries with backoff
// while some channel cannot be placed.
func (b *ClusterBus) placer() {
	defer b.wg.Done()
	timer := time.NewTimer(b.cfg.CheckInterval)
	defer timer.Stop()
	var backoff time.Duration
	for {
		checkAll := false
		select {
		case <-b.ctx.Done():
			return
		case <-b.kick:
			if backoff > 0 {
				continue // retrying already: the timer brings the next attempt
			}
			timer.Stop() // Go 1.23 timers: nothing stale is left to drain
		case <-timer.C:
			checkAll = backoff == 0
			if checkAll {
				b.cfg.Client.ReloadState(b.ctx) // for the next check: the reload is asynchronous
			}
		}
		if b.place(checkAll) {
			backoff = 0
			timer.Reset(b.cfg.CheckInterval)
			continue
		}
		// Something is unplaced: the slot map may be stale (a failover or a
		// migration in progress). Reload it and try again soon.
		b.cfg.Client.ReloadState(b.ctx)
		backoff = min(max(2*backoff, minBackoff), maxPlaceBackoff)
		timer.Reset(backoff/2 + rand.N(backoff/2))
	}
}

// place subscribes every unplaced channel (every channel with checkAll) on
// the master owning its slot, retires shards nothing is placed on, and
// reports Restored when an outage is over. It reports whether every
// channel is placed.
func (b *ClusterBus) place(checkAll bool) (settled bool) {
	b.mu.Lock()
	var todo []*tenantSub
	for _, e := range b.subs {
		if e.leaving == nil && e.err == nil && (e.shard == nil || checkAll) {
			todo = append(todo, e)
		}
	}
	b.mu.Unlock()

	// Assign every channel, then write.
	type write struct {
		e  *tenantSub
		sh *shard
	}
	var writes []write
	settled = true
	for _, e := range todo {
		if b.ctx.Err() != nil {
			return true
		}
		master, err := b.cfg.Client.MasterForKey(b.ctx, e.channel)
		if err != nil {
			settled = false
			b.unplaceable(e, err)
			continue
		}
		addr := master.Options().Addr

		b.mu.Lock()
		if b.closed || b.subs[e.tenant] != e || e.leaving != nil || e.err != nil {
			b.mu.Unlock()
			continue
		}
		old := e.shard
		if old != nil && old.addr == addr {
			b.mu.Unlock()
			continue // where it belongs
		}
		if old == nil && addr == e.movedFrom && time.Since(e.movedAt) < movedGrace {
			b.mu.Unlock()
			settled = false // the slot map does not show the migration yet
			continue
		}
		sh := b.shardFor(addr, master)
		e.shard, e.placed, e.movedFrom = sh, false, ""
		b.mu.Unlock()
		if old != nil {
			// Found on the wrong master by the periodic check. A master that
			// lost a slot has dropped its channels: no SUNSUBSCRIBE, which
			// it would answer with MOVED.
			b.log.Info("tenant's slot moved; resubscribing", "tenant", e.tenant, "from", old.addr, "to", addr)
		}
		writes = append(writes, write{e, sh})
	}
	for _, w := range writes {
		if err := w.sh.ps.SSubscribe(b.ctx, w.e.channel); err != nil {
			settled = false
			b.retire(w.sh, err, false)
			b.unplaceable(w.e, err)
			continue
		}
		b.stats.subscribes.Add(1)
	}
	b.retireIdle()
	b.checkRestored()
	return settled
}

// unplaceable fails a subscription that was never confirmed, so its
// Subscribe returns err (the hub retries it later); a confirmed one stays
// unplaced and is retried.
func (b *ClusterBus) unplaceable(e *tenantSub, err error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if e.confirmed || e.err != nil || b.subs[e.tenant] != e {
		return
	}
	e.shard = nil
	e.fail(fmt.Errorf("subscribe %s: %w", e.tenant, err))
	delete(b.subs, e.tenant)
}

// shardFor returns the live shard of a master, making one (and starting
// its reader) if there is none. b.mu is held; it does no I/O.
func (b *ClusterBus) shardFor(addr string, node *redis.Client) *shard {
	if sh := b.shards[addr]; sh != nil {
		return sh
	}
	o := *node.Options()
	dial := o.Dialer
	if b.dialShard != nil {
		dial = b.dialShard
	}
	if dial == nil {
		dial = (&net.Dialer{Timeout: o.DialTimeout}).DialContext
	}
	o.Dialer = redisx.DialOnce(dial)
	o.PoolSize, o.MinIdleConns, o.MaxIdleConns = 1, 0, 0
	// Not the master client's: a processor takes one client's handlers.
	o.PushNotificationProcessor = nil
	o.MaintNotificationsConfig = &maintnotifications.Config{Mode: maintnotifications.ModeDisabled}
	client := redis.NewClient(&o)
	sh := &shard{addr: addr, client: client, ps: client.SSubscribe(b.ctx), node: node}
	if b.cfg.LivenessInterval > 0 {
		sh.live = b.livenessChannel(addr)
	}
	b.shards[addr] = sh
	b.wg.Add(1)
	go b.read(sh)
	return sh
}

// retireIdle closes the shards nothing is placed on any more.
func (b *ClusterBus) retireIdle() {
	b.mu.Lock()
	used := make(map[*shard]bool, len(b.shards))
	for _, e := range b.subs {
		if e.shard != nil {
			used[e.shard] = true
		}
	}
	var idle []*shard
	for addr, sh := range b.shards {
		if !used[sh] {
			delete(b.shards, addr)
			idle = append(idle, sh)
		}
	}
	b.mu.Unlock()
	for _, sh := range idle {
		sh.close()
	}
}

// checkRestored ends an outage once every confirmed subscription is
// placed again.
func (b *ClusterBus) checkRestored() {
	b.mu.Lock()
	if !b.outage || b.closed {
		b.mu.Unlock()
		return
	}
	for _, e := range b.subs {
		if e.confirmed && e.err == nil && e.leaving == nil && e.shard == nil {
			b.mu.Unlock()
			return
		}
	}
	b.outage = false
	held := b.heldResyncs
	b.heldResyncs = nil
	b.mu.Unlock()
	b.lost.OK("sharded pubsub restored")
	b.call(func(h Handler) {
		if lh, ok := h.(LossHandler); ok {
			lh.Restored()
		}
		for tenant := range held {
			h.Resync(tenant)
		}
	})
}

// read is a shard's reader: the only reader of its connection.
func (b *ClusterBus) read(sh *shard) {
	defer b.wg.Done()
	if sh.live != "" {
		// First, so the shard is checked from its first channel on.
		if err := sh.ps.SSubscribe(b.ctx, sh.live); err != nil {
			if !sh.retired.Load() && b.ctx.Err() == nil {
				b.shardFailed(sh, err, false)
			}
			return
		}
	}
	pinged := false
	for {
		msg, err := sh.ps.ReceiveTimeout(b.ctx, b.cfg.PingInterval)
		if sh.retired.Load() || b.ctx.Err() != nil {
			return
		}
		if err != nil {
			if err = probe(b.ctx, sh.ps, err, &pinged); err == nil {
				continue
			}
			// A reply that is an error (MOVED, CLUSTERDOWN) answers one of
			// the bus's commands on a connection that works: the slot map
			// moved, not the connection.
			b.shardFailed(sh, err, redisx.IsReply(err))
			return
		}
		pinged = false
		switch m := msg.(type) {
		case *redis.Message:
			if m.Channel == sh.live {
				b.stats.livenessHeard.Add(1)
				sh.heardAt.Store(b.since())
				continue
			}
			b.deliver(m)
		case *redis.Subscription:
			switch {
			case m.Channel == sh.live && m.Kind == "ssubscribe":
				sh.heardAt.Store(b.since()) // the check starts now
			case m.Channel == sh.live && m.Kind == "sunsubscribe":
				// Its slot left this master: a new shard picks another.
				b.shardFailed(sh, errLivenessMoved, true)
				return
			case m.Kind == "ssubscribe":
				b.confirm(sh, m.Channel)
			case m.Kind == "sunsubscribe":
				b.dropped(sh, m.Channel)
			}
		}
	}
}

// since returns the time since the bus was made, on the monotonic clock;
// never 0.
func (b *ClusterBus) since() int64 { return max(int64(time.Since(b.epoch)), 1) }

// livenessChannel returns a liveness channel in a slot the master at addr
// serves by the slot map, or "" if none turned up (the map is changing; the
// shard then has its pings until it is replaced). b.mu is held; the lookups
// are in memory.
func (b *ClusterBus) livenessChannel(addr string) string {
	for range 256 {
		ch := b.cfg.Names.Liveness(fmt.Sprintf("%016x", rand.Uint64()))
		if m, err := b.cfg.Client.MasterForKey(b.ctx, ch); err == nil && m.Options().Addr == addr {
			return ch
		}
	}
	return ""
}

// liveness SPUBLISHes on every shard's liveness channel each
// LivenessInterval (jittered), straight to the shard's master, and replaces
// a shard that has not heard a message its master acknowledged for
// LivenessTimeout. A SPUBLISH that fails says nothing about the
// subscription and starts no clock; one answered MOVED means the liveness
// slot left the master, and the shard is replaced without a loss.
func (b *ClusterBus) liveness() {
	defer b.wg.Done()
	clocks := map[*shard]*livenessClock{}
	timeout := int64(b.cfg.LivenessTimeout)
	timer := time.NewTimer(livenessDelay(b.cfg.LivenessInterval))
	defer timer.Stop()
	var seq uint64
	for {
		select {
		case <-timer.C:
		case <-b.ctx.Done():
			return
		}
		b.mu.Lock()
		shards := make([]*shard, 0, len(b.shards))
		for _, sh := range b.shards {
			if sh.live != "" {
				shards = append(shards, sh)
			}
		}
		b.mu.Unlock()
		seq++
		next := make(map[*shard]*livenessClock, len(shards))
		for _, sh := range shards {
			c := clocks[sh]
			if c == nil {
				c = &livenessClock{}
			}
			next[sh] = c
			if c.silent(sh.heardAt.Load(), b.since(), timeout) {
				b.shardFailed(sh, fmt.Errorf("%w within %v", errNoLiveness, b.cfg.LivenessTimeout), false)
				continue
			}
			start := b.since()
			ctx, cancel := context.WithTimeout(b.ctx, b.cfg.LivenessTimeout)
			err := sh.node.SPublish(ctx, sh.live, strconv.FormatUint(seq, 10)).Err()
			cancel()
			switch {
			case b.ctx.Err() != nil:
				return
			case err == nil:
				b.stats.livenessSent.Add(1)
				c.acked(start, b.since())
			case redisx.IsMoved(err):
				b.shardFailed(sh, errLivenessMoved, true)
			default:
				b.stats.livenessFailures.Add(1)
			}
		}
		clocks = next
		timer.Reset(livenessDelay(b.cfg.LivenessInterval))
	}
}

// shardFailed retires a shard and unplaces what it held, for the placer to
// subscribe again; a connection failure (not a command's error reply) of a
// shard that held confirmed tenants reports Lost.
func (b *ClusterBus) shardFailed(sh *shard, err error, reply bool) {
	b.retire(sh, err, reply)
	b.cfg.Client.ReloadState(b.ctx)
	b.wake()
}

// retire is shardFailed without waking the placer: the placer's own failed
// writes are retried after its backoff.
func (b *ClusterBus) retire(sh *shard, err error, reply bool) {
	if sh.retired.Swap(true) {
		return
	}
	b.stats.failures.Add(1)
	b.mu.Lock()
	if b.shards[sh.addr] == sh {
		delete(b.shards, sh.addr)
	}
	held := 0
	for _, e := range b.subs {
		if e.shard == sh {
			e.shard, e.placed = nil, false
			if e.confirmed {
				held++
			}
		}
	}
	lost := !reply && held > 0 && !b.outage && !b.closed
	during := b.outage
	if lost {
		b.outage = true
	}
	b.mu.Unlock()
	sh.close()
	if b.ctx.Err() != nil {
		return
	}
	if lost {
		b.stats.losses.Add(1)
		b.lost.Fail("sharded pubsub connection lost; resubscribing", err, "master", sh.addr, "tenants", held)
		b.call(func(h Handler) {
			if lh, ok := h.(LossHandler); ok {
				lh.Lost(err)
			}
		})
	} else if during {
		b.lost.Fail("sharded pubsub connection lost; resubscribing", err, "master", sh.addr, "tenants", held) // a debug line, or the summary
	} else {
		b.log.Debug("sharded pubsub connection replaced", "master", sh.addr, "tenants", held, "err", err)
	}
}

// confirm handles an ssubscribe confirmation.
func (b *ClusterBus) confirm(sh *shard, channel string) {
	tenant, ok := b.cfg.Names.TenantFromChannel(channel)
	if !ok {
		return
	}
	b.mu.Lock()
	e := b.subs[tenant]
	if e == nil || e.shard != sh || e.placed || e.leaving != nil || e.err != nil {
		b.mu.Unlock() // a reply about a subscription since undone or moved
		return
	}
	e.placed = true
	resync := b.confirmedNow(e)
	hold := resync && b.outage
	if hold {
		if b.heldResyncs == nil {
			b.heldResyncs = make(map[string]struct{})
		}
		b.heldResyncs[tenant] = struct{}{} // Restored comes first
	}
	b.mu.Unlock()
	if resync {
		b.stats.resyncs.Add(1)
		b.log.Debug("resubscribed", "tenant", tenant, "master", sh.addr)
	}
	if resync && !hold {
		b.call(func(h Handler) { h.Resync(tenant) })
	}
}

// dropped handles an sunsubscribe: the reply to the bus's own, or the
// master saying it no longer serves the channel's slot.
func (b *ClusterBus) dropped(sh *shard, channel string) {
	tenant, ok := b.cfg.Names.TenantFromChannel(channel)
	if !ok {
		return
	}
	b.mu.Lock()
	e := b.subs[tenant]
	if e == nil || e.shard != sh || e.leaving != nil {
		b.mu.Unlock()
		return
	}
	e.shard, e.placed = nil, false
	e.movedFrom, e.movedAt = sh.addr, time.Now()
	b.mu.Unlock()
	b.log.Info("tenant's slot left its master; resubscribing", "tenant", tenant, "master", sh.addr)
	b.cfg.Client.ReloadState(b.ctx)
	b.wake()
}

// deliver parses a message and hands it to the handler, or counts and drops
// it.
func (b *ClusterBus) deliver(m *redis.Message) {
	b.stats.received.Add(1)
	n, reason, err := parseMessage(b.cfg.Names, m)
	if err != nil {
		b.drops.drop(b.log, &b.stats, reason, m.Channel, err)
		return
	}
	b.call(func(h Handler) { h.Notify(n) })
}

// call runs f on the handler, one call at a time across the shards'
// readers and the placer.
// Every caller runs after Start set b.h.
func (b *ClusterBus) call(f func(Handler)) {
	b.hmu.Lock()
	defer b.hmu.Unlock()
	f(b.h)
}

// close closes the shard's connection and client; its reader returns.
func (sh *shard) close() {
	sh.retired.Store(true)
	_ = sh.ps.Close()
	_ = sh.client.Close()
}
