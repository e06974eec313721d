package stream

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"hash/maphash"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pushd/pushd/internal/episode"
	"github.com/pushd/pushd/keys"
	"github.com/pushd/pushd/snapshot"
	"github.com/pushd/pushd/stream/cursor"
)

// ErrClosed is returned by Watch on a closed Tailer.
var ErrClosed = errors.New("stream: tailer closed")

// Target is what a Tailer delivers to; *hub.Hub implements it.
type Target interface {
	// Apply delivers a batch of a tenant's changes before it returns; an
	// error means it must be retried (see hub.Hub.Apply).
	Apply(ctx context.Context, tenant string, changes []snapshot.Notification) error
	// ResyncNow re-reads everything the tenant's connections watch before
	// it returns, and reports whether every read succeeded.
	ResyncNow(tenant string) bool
}

// Subscriber is the subscription side of a bus (fanout.Bus, hub.Bus).
type Subscriber interface {
	Subscribe(ctx context.Context, tenantID string) (release func(), err error)
}

// Config configures a Tailer. Only Client is required.
type Config struct {
	// Client runs the Tailer's commands (XINFO, GET, XRANGE for Replay):
	// a *redis.Client, or a *redis.ClusterClient for Redis Cluster. The
	// readers' XREADs run on a client of their own, made with Client's
	// options, so they never hold the client's pool. Required.
	//
	// On a standalone Redis each reader issues one XREAD BLOCK over all its
	// streams. On a cluster one XREAD cannot span slots, and each tenant's
	// stream has its own: there each stream has an XREAD BLOCK of its own
	// in flight, on a connection of its own to its master, up to
	// ClusterReads per master (see sharded.go).
	Client redis.UniversalClient
	// Names spells the streams. The zero value uses the names of
	// docs/DESIGN.md, "Key names".
	Names keys.Names
	// Readers bounds the connections that XREAD on a standalone Redis;
	// each XREAD round covers every stream of the tenants hashed to its
	// reader. On a cluster it is the number of reader loops, each with up
	// to one polling connection per master. Zero means 4.
	Readers int
	// ClusterReads bounds, on a cluster, the blocking XREADs (one per
	// tenant stream, each on a connection of its own) the readers keep in
	// flight on one master; the streams past it are polled every Block.
	// Zero means 128.
	ClusterReads int
	// Block is how long one XREAD waits for entries (on a cluster, also
	// how often the streams past ClusterReads are polled). A reader that has not
	// heard from Redis for 2 × Block + 1s no longer covers its tenants.
	// Zero means 1s.
	Block time.Duration
	// Count bounds the entries one XREAD returns per stream. Zero means 256.
	Count int64
	// MaxReplay bounds the entries Replay returns; a cursor further behind
	// is answered with a full resync. Zero means 1000.
	MaxReplay int
	// CheckInterval is how often a reader checks that its streams were
	// neither trimmed past its position nor recreated, and reads their
	// lengths; a reader also checks after every failed read. Zero means 10s.
	CheckInterval time.Duration
	// Logger receives the tailer's logs. Nil means slog.Default().
	Logger *slog.Logger
}

// RegisterFlags defines on fs a flag for each setting of c an operator
// sets, bound to its field, with the field's value as its default: call it
// on a Config with its defaults (DefaultConfig or WithDefaults).
func (c *Config) RegisterFlags(fs *flag.FlagSet) {
	fs.IntVar(&c.ClusterReads, "stream-cluster-reads", c.ClusterReads, "with --streams on Redis Cluster, blocking stream reads (one per watched tenant, each on a connection of its own) this node keeps open on each master; the tenants past it are polled every second")
}

// WithDefaults returns c with each zero setting that has a default set to
// it; it is the one place those defaults are written.
func (c Config) WithDefaults() Config {
	if c.Readers <= 0 {
		c.Readers = 4
	}
	if c.ClusterReads <= 0 {
		c.ClusterReads = 128
	}
	if c.Block <= 0 {
		c.Block = time.Second
	}
	if c.Count <= 0 {
		c.Count = 256
	}
	if c.MaxReplay <= 0 {
		c.MaxReplay = 1000
	}
	if c.CheckInterval <= 0 {
		c.CheckInterval = 10 * time.Second
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

// placeTimeout bounds Watch's look at a stream; past it the reader places
// the tail later, followed by a re-read of the tenant.
const placeTimeout = 2 * time.Second

// Backoff after a failed read, so a reader does not spin while Redis is down.
const (
	minBackoff = 50 * time.Millisecond
	maxBackoff = 2 * time.Second
)

// Tailer follows the streams of the tenants watched on this node (Watch,
// reference-counted), delivering every entry to its Target once, in order.
//
// A tenant's tail is "placed" when it knows where to read from: the
// stream's last id when it was first watched (the connections that watch
// it read their initial state after that), and afterwards the last id
// Apply took. It is "verified" while nothing puts its continuity in doubt;
// a failed read does, until a check finds the stream unchanged (same epoch,
// nothing after the tail's id trimmed or lost). A tail that cannot continue
// is placed anew, and its tenant re-read before it gets a Position again.
type Tailer struct {
	cfg Config
	log *slog.Logger
	xrd redis.UniversalClient // the readers' own connections
	// sharded: xrd is a *redis.ClusterClient; readers keep a single-key
	// XREAD BLOCK in flight per stream instead of one over all (sharded.go).
	sharded  bool
	blockMu  sync.Mutex
	blocking map[string]int // master address → blocking reads in flight on it
	ctx      context.Context
	cancel   context.CancelFunc
	wg       sync.WaitGroup // the readers

	readers []*reader
	dials   atomic.Uint64 // connections the readers' client opened
	seed    maphash.Seed
	stats   *counters
	target  Target // set by Start, before any reader runs

	mu      sync.RWMutex
	started bool
	closed  bool
	tenants map[string]*tail
}

// tail is one tenant's. tenant, key, epochKey and rd never change; the
// other fields are guarded by Tailer.mu and written only by rd's loop, save
// at the placement in Watch, before rd sees the tail.
type tail struct {
	tenant, key, epochKey string
	rd                    *reader
	ready                 chan struct{} // closed when Watch's placement ended, placed or not

	refs     int
	placed   bool      // last is a start from which the stream delivers every later change
	verified bool      // placed, and its continuity not in doubt
	resync   string    // not placed: the reason it is to be placed anew, after which the tenant is re-read
	epoch    cursor.ID // the stream incarnation's, when epochKnown
	known    bool      // epoch is known
	learn    bool      // epoch unknown: learn it from the first entry read, if that entry is the epoch
	last     cursor.ID
	pos      string // the encoded Position, "" while none
	length   int64
	gen      uint64 // bumped whenever the tail is placed or unplaced: reads begun before are of another placement
}

// NewTailer returns a Tailer; it does no I/O. Start begins the readers.
func NewTailer(cfg Config) *Tailer {
	cfg = cfg.WithDefaults()
	ctx, cancel := context.WithCancel(context.Background())
	t := &Tailer{
		cfg: cfg, log: cfg.Logger.With("component", "stream"),
		ctx: ctx, cancel: cancel,
		seed: maphash.MakeSeed(), tenants: make(map[string]*tail), blocking: make(map[string]int),
		stats: newCounters(),
	}
	switch c := cfg.Client.(type) {
	case *redis.Client:
		t.xrd = redis.NewClient(t.readerOptions(c))
	case *redis.ClusterClient:
		t.xrd, t.sharded = redis.NewClusterClient(t.clusterReaderOptions(c)), true
	case nil:
		panic("stream: Config.Client is required")
	default:
		panic(fmt.Sprintf("stream: Config.Client is a %T; want a *redis.Client or a *redis.ClusterClient", c))
	}
	for range cfg.Readers {
		t.readers = append(t.readers, &reader{t: t, wake: make(chan struct{}, 1), lost: episode.New(t.log, "stream reads still failing")})
	}
	return t
}

// Start begins the readers, delivering to target. It must be called once,
// before Watch. Start after Close does nothing.
func (t *Tailer) Start(target Target) {
	if target == nil {
		panic("stream: Start with a nil Target")
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.started {
		panic("stream: Tailer started twice")
	}
	if t.closed {
		return
	}
	t.started, t.target = true, target
	for _, r := range t.readers {
		r.lastOK.Store(time.Now().UnixNano())
		t.wg.Add(1)
		go r.run()
	}
}

// Close stops the readers, closes their connections and waits for them. It
// is idempotent. It does not close Config.Client.
func (t *Tailer) Close() error {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return nil
	}
	t.closed = true
	t.mu.Unlock()
	t.cancel()
	err := t.xrd.Close() // fails a blocked XREAD at once
	t.wg.Wait()
	if err != nil {
		return fmt.Errorf("close stream readers: %w", err)
	}
	return nil
}

// Watch takes a reference on tenant's stream. The first reference places
// the tail (one round trip, bounded by ctx and a short timeout) before it
// returns, so the caller's reads of the current state come after the tail's
// start and nothing falls between them. A placement that fails is retried
// by the reader, which then re-reads the tenant. Later references wait for
// the first one's placement. release drops the reference and is idempotent;
// the last one stops the tail.
func (t *Tailer) Watch(ctx context.Context, tenant string) (release func(), err error) {
	if !snapshot.ValidID(tenant) {
		return nil, fmt.Errorf("watch %q: %w", tenant, snapshot.ErrInvalidID)
	}
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return nil, ErrClosed
	}
	tl := t.tenants[tenant]
	first := tl == nil
	if first {
		tl = &tail{
			tenant: tenant, key: t.cfg.Names.Stream(tenant), epochKey: t.cfg.Names.StreamEpoch(tenant),
			rd:    t.readers[maphash.String(t.seed, tenant)%uint64(len(t.readers))],
			ready: make(chan struct{}),
		}
		t.tenants[tenant] = tl
	}
	tl.refs++
	t.mu.Unlock()

	var once sync.Once
	release = func() { once.Do(func() { t.release(tl) }) }
	if first {
		pctx, cancel := context.WithTimeout(ctx, placeTimeout)
		st, err := t.look(pctx, tl)
		cancel()
		t.mu.Lock()
		if err == nil {
			t.placeLocked(tl, st)
		} else {
			tl.resync = ResyncStart
		}
		close(tl.ready)
		t.mu.Unlock()
		if err != nil {
			t.log.Debug("placing the tail failed; the reader retries", "tenant", tenant, "err", err)
		}
		tl.rd.signal()
		return release, nil
	}
	select {
	case <-tl.ready:
		return release, nil
	case <-ctx.Done():
		release()
		return nil, ctx.Err()
	}
}

func (t *Tailer) release(tl *tail) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if tl.refs--; tl.refs == 0 && t.tenants[tl.tenant] == tl {
		delete(t.tenants, tl.tenant)
	}
}

// Subscriber returns a Subscriber that takes a reference on both bus and
// the tenant's stream, and releases both: the hub's bus when streams are on.
func (t *Tailer) Subscriber(bus Subscriber) Subscriber { return both{bus, t} }

type both struct {
	bus Subscriber
	t   *Tailer
}

func (b both) Subscribe(ctx context.Context, tenant string) (func(), error) {
	tr, err := b.t.Watch(ctx, tenant)
	if err != nil {
		return nil, err
	}
	br, err := b.bus.Subscribe(ctx, tenant)
	if err != nil {
		tr()
		return nil, err
	}
	return func() { br(); tr() }, nil
}

// Position is the tenant's resume cursor, "" when the tail has none (not
// placed, its epoch unknown, or being replaced). It does not allocate.
func (t *Tailer) Position(tenant string) string {
	t.mu.RLock()
	defer t.mu.RUnlock()
	if tl := t.tenants[tenant]; tl != nil {
		return tl.pos
	}
	return ""
}

// Covers reports whether the tenant's tail is verified and its reader
// healthy: every change of the tenant reaches the Target.
func (t *Tailer) Covers(tenant string) bool {
	t.mu.RLock()
	defer t.mu.RUnlock()
	tl := t.tenants[tenant]
	return tl != nil && tl.verified && tl.rd.healthy()
}

// CoversAll is Covers for every tenant watched.
func (t *Tailer) CoversAll() bool {
	t.mu.RLock()
	defer t.mu.RUnlock()
	for _, tl := range t.tenants {
		if !tl.verified || !tl.rd.healthy() {
			return false
		}
	}
	return true
}

// Stats returns the tailer's counters and gauges.
func (t *Tailer) Stats() Stats {
	s := t.stats.stats()
	for _, r := range t.readers {
		s.Polled += int(r.polled.Load())
	}
	t.mu.RLock()
	defer t.mu.RUnlock()
	s.Tailed = len(t.tenants)
	for _, tl := range t.tenants {
		s.Length += tl.length
		s.MaxLength = max(s.MaxLength, tl.length)
	}
	return s
}
