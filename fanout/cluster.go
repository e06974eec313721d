package fanout

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pushd/pushd/internal/episode"
	"github.com/pushd/pushd/snapshot"
)

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
// Each shard also subscribes a liveness channel, named after the first slot
// of its master's first range (keys.Names.ShardLiveness), the same on every
// node, on which the bus SPUBLISHes its own id and a sequence number every
// LivenessInterval; a shard that stops hearing its own messages is replaced
// as if its connection had failed. A migration or failover that moves that
// slot makes the master drop the channel (sunsubscribe) or refuse the
// SPUBLISH (MOVED): the shard is replaced, and its successor names the
// channel after the master's new first slot.
//
// A connection failure of a shard holding confirmed tenants is reported
// per tenant to a TenantLossHandler: TenantsLost names that shard's
// tenants, and each one's TenantsRestored and Resync follow its
// confirmation on the master that owns its slot now. To another handler it
// is reported for the whole bus: Lost (once per outage); Restored follows
// when every such tenant is subscribed again, and each one's Resync when
// its confirmation arrives. Handler calls are made one at a time.
type ClusterBus struct {
	cfg    BusConfig            // defaults applied
	client *redis.ClusterClient // cfg.Client
	log    *slog.Logger
	lost   *episode.Logger // the outages: from Lost to Restored
	ctx    context.Context // done at Close
	cancel context.CancelFunc
	kick   chan struct{} // wakes the placer; buffered
	wg     sync.WaitGroup
	hmu    sync.Mutex // serializes Handler calls
	stats  redisCounters
	epoch  time.Time // origin of since()
	id     string    // random per bus; begins its liveness messages, to tell them from other nodes' on the same channels

	// dialShard, when set by a test before Start, dials the shard
	// connections instead of the master client's dialer.
	dialShard func(ctx context.Context, network, addr string) (net.Conn, error)

	drops dropLog

	subTable                   // its mutex guards the fields below and the subscriptions' placement
	h        Handler           // set by Start, before the goroutines that call it
	tl       TenantLossHandler // h, if it hears losses per tenant; set with h
	shards   map[string]*shard // the live shard of each master address
	outage   bool              // Lost was reported, Restored not yet; with tl, some tenant is lost
	lostN    int               // with tl, the tenants lost
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
	// shard's liveness channel, set once by the reader under the bus's
	// mutex; "" until then, and for good when the check is off or the
	// master named no slot. heardAt is since() when the reader last heard
	// the bus's own message on it (0: never).
	node    *redis.Client
	live    string
	heardAt atomic.Int64
}

var _ Bus = (*ClusterBus)(nil)

// NewClusterBus returns a bus on cfg.Client, which must be a
// *redis.ClusterClient: it panics otherwise. It does no I/O.
func NewClusterBus(cfg BusConfig) *ClusterBus {
	client, ok := cfg.Client.(*redis.ClusterClient)
	if !ok || client == nil {
		panic(fmt.Sprintf("fanout: NewClusterBus needs a *redis.ClusterClient as BusConfig.Client, not %T", cfg.Client))
	}
	cfg = cfg.withDefaults()
	ctx, cancel := context.WithCancel(context.Background())
	log := cfg.Logger.With("component", "fanout")
	b := &ClusterBus{
		cfg:      cfg,
		client:   client,
		log:      log,
		lost:     episode.New(log, "sharded pubsub still down"),
		ctx:      ctx,
		cancel:   cancel,
		kick:     make(chan struct{}, 1),
		epoch:    time.Now(),
		id:       fmt.Sprintf("%016x", rand.Uint64()),
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
	b.tl, _ = h.(TenantLossHandler)
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
	wasLost := e.lost
	ended := wasLost && b.unlostLocked(e)
	b.mu.Unlock()
	if wasLost {
		// Unreferenced and unplaced: nothing of it is subscribed, so
		// nothing of it is lost; a new Subscribe starts afresh.
		if ended {
			b.lost.OK("sharded pubsub restored")
		}
		b.syncLoss([]*tenantSub{e}, false)
	}
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

// call runs f on the handler, one call at a time across the shards'
// readers and the placer.
// Every caller runs after Start set b.h.
func (b *ClusterBus) call(f func(Handler)) {
	b.hmu.Lock()
	defer b.hmu.Unlock()
	f(b.h)
}
