package stream

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"log/slog"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pushd/pushd/fanout"
	"github.com/pushd/pushd/internal/episode"
	"github.com/pushd/pushd/internal/redisx"
	"github.com/pushd/pushd/keys"
	"github.com/pushd/pushd/snapshot"
)

// ErrClosed is returned by Watch on a closed Tailer.
var ErrClosed = errors.New("stream: tailer closed")

// Target is what a Tailer delivers to; *hub.Hub implements it.
type Target interface {
	// Apply delivers a batch of a tenant's changes before it returns; an
	// error means it must be retried (see hub.Hub.Apply).
	Apply(ctx context.Context, tenant string, changes []fanout.Notification) error
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
	// streams. On a cluster one XREAD cannot span slots, and a blocking one
	// per slot would hold a connection per slot: there each reader reads
	// its streams with a pipeline of single-key non-blocking XREADs, which
	// the cluster client splits per master, and when nothing came waits up
	// to Block (less when a tenant is added) before the next round.
	Client redis.UniversalClient
	// Names spells the streams. The zero value uses the names of
	// docs/DESIGN.md, "Key names".
	Names keys.Names
	// Readers bounds the connections that XREAD (per master on a cluster);
	// each XREAD round covers every stream of the tenants hashed to its
	// reader. Zero means 4.
	Readers int
	// Block is how long one XREAD waits for entries (on a cluster, how long
	// a reader waits after a round that found none). A reader that has not
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

func (c Config) withDefaults() Config {
	if c.Readers <= 0 {
		c.Readers = 4
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
	// sharded: xrd is a *redis.ClusterClient; readers poll a pipeline of
	// single-key XREADs instead of one XREAD BLOCK.
	sharded bool
	ctx     context.Context
	cancel  context.CancelFunc
	wg      sync.WaitGroup // the readers

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
	placed   bool   // last is a start from which the stream delivers every later change
	verified bool   // placed, and its continuity not in doubt
	resync   string // not placed: the reason it is to be placed anew, after which the tenant is re-read
	epoch    ID     // the stream incarnation's, when epochKnown
	known    bool   // epoch is known
	learn    bool   // epoch unknown: learn it from the first entry read, if that entry is the epoch
	last     ID
	pos      string // the encoded Position, "" while none
	length   int64
}

// NewTailer returns a Tailer; it does no I/O. Start begins the readers.
func NewTailer(cfg Config) *Tailer {
	cfg = cfg.withDefaults()
	ctx, cancel := context.WithCancel(context.Background())
	t := &Tailer{
		cfg: cfg, log: cfg.Logger.With("component", "stream"),
		ctx: ctx, cancel: cancel,
		seed: maphash.MakeSeed(), tenants: make(map[string]*tail),
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

// readerOptions are the readers' connections': Client's server and
// credentials, a pool of one connection per reader, no retries (a read that
// failed must be seen: Redis may have restarted empty), each XREAD bounded
// by its own deadline (Block plus a margin, not go-redis's Block plus 10s),
// and every new connection counted, because a reader may be handed a new
// one, to a Redis that restarted, without any command failing.
func (t *Tailer) readerOptions(client *redis.Client) *redis.Options {
	c := client.Options()
	return &redis.Options{
		Network: c.Network, Addr: c.Addr, Dialer: c.Dialer, TLSConfig: c.TLSConfig,
		Username: c.Username, Password: c.Password, CredentialsProvider: c.CredentialsProvider,
		DB: c.DB, Protocol: c.Protocol, ClientName: c.ClientName,
		DialTimeout: c.DialTimeout, WriteTimeout: c.WriteTimeout, DialerRetries: c.DialerRetries,
		PoolSize: t.cfg.Readers, MaxIdleConns: t.cfg.Readers,
		MaxRetries:            -1,
		ContextTimeoutEnabled: true,
		OnConnect:             t.countDial,
	}
}

// clusterReaderOptions are readerOptions for a cluster: Client's seeds,
// topology source and credentials, a pool of one connection per reader per
// master, and every new connection counted. A connection to a master the
// readers did not use before (a promoted replica after a failover, a
// restarted master) is a dial, so the readers check their tails before
// trusting what it says. A slot migrated between masters moves the stream
// and its epoch key with it, so following MOVED keeps continuity; the
// cluster client's redirects stay on.
func (t *Tailer) clusterReaderOptions(client *redis.ClusterClient) *redis.ClusterOptions {
	c := client.Options()
	return &redis.ClusterOptions{
		Addrs: c.Addrs, ClusterSlots: c.ClusterSlots, Dialer: c.Dialer, TLSConfig: c.TLSConfig,
		Username: c.Username, Password: c.Password, CredentialsProvider: c.CredentialsProvider,
		Protocol: c.Protocol, ClientName: c.ClientName,
		DialTimeout: c.DialTimeout, WriteTimeout: c.WriteTimeout, DialerRetries: c.DialerRetries,
		MaxRedirects: c.MaxRedirects,
		PoolSize:     t.cfg.Readers, MaxIdleConns: t.cfg.Readers,
		MaxRetries:            -1,
		ContextTimeoutEnabled: true,
		OnConnect:             t.countDial,
	}
}

// reloadTopology asks the cluster clients to refresh their slot maps after
// a failed command: go-redis does so by itself on MOVED, but a master that
// died answers nothing, and until the refresh every command for its slots
// would be sent to it again. The refresh runs in the background, at most
// about once per 200ms however often it is asked for.
func (t *Tailer) reloadTopology() {
	if !t.sharded {
		return
	}
	t.xrd.(*redis.ClusterClient).ReloadState(t.ctx)
	if cc, ok := t.cfg.Client.(*redis.ClusterClient); ok {
		cc.ReloadState(t.ctx)
	}
}

func (t *Tailer) countDial(context.Context, *redis.Conn) error {
	t.dials.Add(1)
	return nil
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
	t.mu.RLock()
	defer t.mu.RUnlock()
	s.Tailed = len(t.tenants)
	for _, tl := range t.tenants {
		s.Length += tl.length
		s.MaxLength = max(s.MaxLength, tl.length)
	}
	return s
}

// state is what one look at a stream found.
type state struct {
	exists     bool
	epoch      ID
	known      bool  // the epoch key exists
	last       ID    // last-generated-id
	maxDeleted ID    // max-deleted-entry-id: the newest entry XDEL removed
	first      ID    // the first entry's id, when length > 0
	length     int64 // entries now
	added      int64 // entries ever appended to this incarnation
}

// lost reports whether entries after id may have been removed: deleted, or
// trimmed (trimming takes the oldest entries and leaves no mark but the
// first entry's id). It errs on the safe side: when id itself was trimmed,
// it cannot tell whether the entry right after it went too, and says so.
func (st state) lost(id ID) bool {
	switch {
	case id.Less(st.maxDeleted):
		return true
	case st.length > 0:
		return id.Less(st.first)
	default:
		return id.Less(st.last)
	}
}

// look reads a stream's state in one round trip.
func (t *Tailer) look(ctx context.Context, tl *tail) (state, error) {
	pipe := t.cfg.Client.Pipeline()
	ep := pipe.Get(ctx, tl.epochKey)
	info := pipe.XInfoStream(ctx, tl.key)
	pipe.Exec(ctx) // each command's error is checked below
	return readState(ep, info)
}

func readState(ep *redis.StringCmd, info *redis.XInfoStreamCmd) (state, error) {
	var st state
	if err := info.Err(); err != nil {
		if !redisx.IsNoSuchKey(err) {
			return st, fmt.Errorf("xinfo stream: %w", err)
		}
		return st, nil // no stream: nothing after any start
	}
	switch e, err := ep.Result(); {
	case errors.Is(err, redis.Nil):
	case err != nil:
		return st, fmt.Errorf("get stream epoch: %w", err)
	default:
		if st.epoch, err = ParseID(e); err == nil {
			st.known = true
		}
	}
	v := info.Val()
	var err error
	if st.last, err = ParseID(v.LastGeneratedID); err != nil {
		return st, fmt.Errorf("xinfo stream: last-generated-id %q: %w", v.LastGeneratedID, err)
	}
	if v.MaxDeletedEntryID != "" {
		if st.maxDeleted, err = ParseID(v.MaxDeletedEntryID); err != nil {
			return st, fmt.Errorf("xinfo stream: max-deleted-entry-id %q: %w", v.MaxDeletedEntryID, err)
		}
	}
	if v.Length > 0 {
		if st.first, err = ParseID(v.FirstEntry.ID); err != nil {
			return st, fmt.Errorf("xinfo stream: first entry %q: %w", v.FirstEntry.ID, err)
		}
	}
	st.exists, st.length, st.added = true, v.Length, v.EntriesAdded
	return st, nil
}

// placeLocked starts tl after what st saw. t.mu is held.
func (t *Tailer) placeLocked(tl *tail, st state) {
	tl.placed, tl.verified, tl.resync = true, true, ""
	tl.last, tl.length = st.last, st.length
	tl.epoch, tl.known = st.epoch, st.known
	// A stream with no epoch yet (none, or made by a writer that keeps
	// none) gets one at its next write if the key is missing: that write
	// is the first entry this tail reads.
	tl.learn = !st.known
	tl.pos = ""
	if tl.known {
		tl.pos = encodeCursor(position{tag: tenantTag(tl.tenant), epoch: tl.epoch, id: tl.last})
	}
}

// gap says why tl cannot continue on the stream st shows, "" if it can.
func gap(tl *tail, st state) string {
	switch {
	case !st.exists:
		if tl.last.IsZero() {
			return "" // still nothing to read
		}
		return ResyncBackwards
	case tl.known && (!st.known || st.epoch != tl.epoch):
		return ResyncEpoch
	case st.last.Less(tl.last):
		return ResyncBackwards
	case tl.last.IsZero():
		// Placed before the stream existed: every entry is one to read,
		// and none may have gone.
		if st.added > st.length || !st.maxDeleted.IsZero() {
			return ResyncTrimmed
		}
	case st.lost(tl.last):
		return ResyncTrimmed
	}
	return ""
}

// reader is one XREAD connection's loop and the tails hashed to it.
type reader struct {
	t      *Tailer
	wake   chan struct{}   // cap 1: a tail was added
	lost   *episode.Logger // failed reads, until a check clears the doubt they cast
	lastOK atomic.Int64    // Unix ns when Redis last answered this reader (or it had nothing to read)
	// Owned by run.
	doubt     bool   // a read failed, or ran on a new connection: check every tail before trusting it again
	dials     uint64 // Tailer.dials when the last check began
	nextCheck time.Time
}

func (r *reader) signal() {
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

func (r *reader) healthy() bool {
	return time.Since(time.Unix(0, r.lastOK.Load())) < 2*r.t.cfg.Block+time.Second
}

// mine returns the tails of this reader that Watch has finished placing
// (or failed to).
func (r *reader) mine() []*tail {
	t := r.t
	t.mu.RLock()
	defer t.mu.RUnlock()
	var out []*tail
	for _, tl := range t.tenants {
		if tl.rd != r {
			continue
		}
		select {
		case <-tl.ready:
			out = append(out, tl)
		default: // Watch is placing it
		}
	}
	return out
}

// run is the reader's loop: place what needs placing, check what is in
// doubt, XREAD the rest, deliver.
func (r *reader) run() {
	t := r.t
	defer t.wg.Done()
	var backoff time.Duration
	r.nextCheck = time.Now().Add(t.cfg.CheckInterval)
	for t.ctx.Err() == nil {
		tails := r.mine()
		ok := r.prepare(tails)
		var streams []string
		var ids []string
		byKey := make(map[string]*tail)
		t.mu.RLock()
		for _, tl := range tails {
			if tl.verified {
				streams = append(streams, tl.key)
				ids = append(ids, tl.last.String())
				byKey[tl.key] = tl
			}
		}
		t.mu.RUnlock()
		if len(streams) == 0 {
			r.lastOK.Store(time.Now().UnixNano()) // nothing to read is not a failure
			if !r.idle(ok) {
				return
			}
			continue
		}
		res, err := r.read(streams, ids)
		if t.ctx.Err() != nil {
			return
		}
		if err != nil && !errors.Is(err, redis.Nil) {
			t.stats.readErrors.Add(1)
			r.lost.Fail("stream read failed; checking the streams once Redis answers", err)
			r.distrust(tails)
			t.reloadTopology()
			backoff = min(max(2*backoff, minBackoff), maxBackoff)
			if !r.sleep(backoff/2 + rand.N(backoff/2)) {
				return
			}
			continue
		}
		backoff = 0
		t.stats.reads.Add(1)
		if t.dials.Load() != r.dials {
			// The read may have run on a Redis that restarted empty since
			// the last check: check first; the entries are read again.
			r.distrust(tails)
			continue
		}
		r.lastOK.Store(time.Now().UnixNano())
		if len(res) == 0 && t.sharded {
			// The round did not block in Redis: wait here.
			if !r.pause() {
				return
			}
			continue
		}
		failed := false
		for _, s := range res {
			if tl := byKey[s.Stream]; tl != nil && !r.deliver(tl, s.Messages) {
				failed = true
			}
		}
		if failed && !r.sleep(minBackoff) { // the batch is read again: give the sources a moment
			return
		}
	}
}

// read returns the entries after ids of streams (redis.Nil for none): one
// XREAD BLOCK on a standalone Redis; on a cluster, a pipeline of single-key
// non-blocking XREADs, which the cluster client sends to each master in one
// round trip. There any command's failure fails the read, as a failed XREAD
// does, and every tail of the reader is checked again.
func (r *reader) read(streams, ids []string) ([]redis.XStream, error) {
	t := r.t
	ctx, cancel := context.WithTimeout(t.ctx, t.cfg.Block+time.Second)
	defer cancel()
	if !t.sharded {
		return t.xrd.XRead(ctx, &redis.XReadArgs{Streams: append(streams, ids...), Count: t.cfg.Count, Block: t.cfg.Block}).Result()
	}
	pipe := t.xrd.Pipeline()
	cmds := make([]*redis.XStreamSliceCmd, len(streams))
	for i := range streams {
		cmds[i] = pipe.XRead(ctx, &redis.XReadArgs{Streams: []string{streams[i], ids[i]}, Count: t.cfg.Count, Block: -1})
	}
	pipe.Exec(ctx) // each command's error is checked below
	var res []redis.XStream
	for _, c := range cmds {
		s, err := c.Result()
		switch {
		case errors.Is(err, redis.Nil):
		case err != nil:
			return nil, err
		default:
			res = append(res, s...)
		}
	}
	if len(res) == 0 {
		return nil, redis.Nil
	}
	return res, nil
}

// pause waits Block after a cluster round that found nothing, or less when
// a tail was added.
func (r *reader) pause() bool { return r.wait(r.t.cfg.Block) }

// idle waits for a tail to be added, or for a retry of what failed.
func (r *reader) idle(ok bool) bool {
	if !ok {
		return r.wait(maxBackoff)
	}
	return r.wait(r.t.cfg.CheckInterval)
}

// wait waits d, or less when a tail is added; false when the tailer closed.
func (r *reader) wait(d time.Duration) bool {
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-r.wake:
	case <-timer.C:
	case <-r.t.ctx.Done():
		return false
	}
	return true
}

func (r *reader) sleep(d time.Duration) bool {
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-timer.C:
		return true
	case <-r.t.ctx.Done():
		return false
	}
}

// distrust takes the tails out of Covers until a check clears them.
func (r *reader) distrust(tails []*tail) {
	if !r.doubt {
		r.t.stats.rechecks.Add(1)
	}
	r.doubt = true
	r.t.mu.Lock()
	for _, tl := range tails {
		tl.verified = false
	}
	r.t.mu.Unlock()
}

// prepare checks the tails when in doubt or when a check is due, and places
// anew (re-reading their tenants) those that cannot continue. It reports
// whether everything it tried succeeded.
func (r *reader) prepare(tails []*tail) bool {
	t := r.t
	if len(tails) == 0 {
		return true
	}
	dials := t.dials.Load()
	due := r.doubt || dials != r.dials || !time.Now().Before(r.nextCheck)
	var todo []*tail
	t.mu.RLock()
	for _, tl := range tails {
		if due || !tl.placed {
			todo = append(todo, tl)
		}
	}
	t.mu.RUnlock()
	if len(todo) == 0 {
		return true
	}
	ctx, cancel := context.WithTimeout(t.ctx, placeTimeout)
	defer cancel()
	pipe := t.cfg.Client.Pipeline()
	eps := make([]*redis.StringCmd, len(todo))
	infos := make([]*redis.XInfoStreamCmd, len(todo))
	for i, tl := range todo {
		eps[i] = pipe.Get(ctx, tl.epochKey)
		infos[i] = pipe.XInfoStream(ctx, tl.key)
	}
	pipe.Exec(ctx)
	ok := true
	for i, tl := range todo {
		st, err := readState(eps[i], infos[i])
		if err != nil {
			ok = false
			t.reloadTopology()
			continue
		}
		t.mu.Lock()
		reason := tl.resync
		if tl.placed {
			reason = gap(tl, st)
		}
		if reason == "" {
			tl.verified, tl.length = true, st.length
			t.mu.Unlock()
			continue
		}
		// Whatever this tail promised no longer holds: no Position until
		// the tenant was re-read.
		tl.placed, tl.verified, tl.pos, tl.resync = false, false, "", reason
		t.mu.Unlock()
		t.stats.resync(reason)
		t.log.Info("stream cannot continue; re-reading the tenant", "tenant", tl.tenant, "reason", reason)
		if !t.target.ResyncNow(tl.tenant) {
			ok = false
			continue // placed again, and re-read again, on the next round
		}
		// st was seen before the re-read started: the tail resumes there.
		t.mu.Lock()
		t.placeLocked(tl, st)
		t.mu.Unlock()
	}
	if ok && due {
		r.lost.OK("stream reads answer again")
		r.doubt, r.dials = false, dials
		r.nextCheck = time.Now().Add(r.t.cfg.CheckInterval)
	}
	return ok
}

// deliver hands a stream's new entries to the Target and, once it took
// them, moves the tail past them. It reports whether the Target took them.
func (r *reader) deliver(tl *tail, msgs []redis.XMessage) bool {
	t := r.t
	if len(msgs) == 0 {
		return true
	}
	changes := make([]fanout.Notification, 0, len(msgs))
	for _, m := range msgs {
		if n, ok := parseEntry(tl.tenant, m); ok {
			changes = append(changes, n)
		} else {
			t.stats.malformed.Add(1)
		}
	}
	first, err1 := ParseID(msgs[0].ID)
	last, err2 := ParseID(msgs[len(msgs)-1].ID)
	if err1 != nil || err2 != nil {
		t.stats.malformed.Add(int64(len(msgs)))
		return true // not Redis's ids; nothing sensible to resume from
	}
	if err := t.target.Apply(t.ctx, tl.tenant, changes); err != nil {
		t.stats.applyErrors.Add(1)
		t.log.Debug("delivering stream entries failed; retrying", "tenant", tl.tenant, "entries", len(msgs), "err", err)
		return false
	}
	now := time.Now()
	for _, m := range msgs {
		if id, err := ParseID(m.ID); err == nil {
			t.stats.lag.Observe(now.Sub(time.UnixMilli(int64(id.MS))))
		}
	}
	t.stats.entries.Add(int64(len(msgs)))

	learn := false
	t.mu.RLock()
	learn = tl.learn
	t.mu.RUnlock()
	var epoch ID
	known := false
	if learn {
		// The first entry read since placement on a stream without an
		// epoch: it is the epoch if the write that made it set the key.
		ctx, cancel := context.WithTimeout(t.ctx, placeTimeout)
		if e, err := t.cfg.Client.Get(ctx, tl.epochKey).Result(); err == nil {
			if id, err := ParseID(e); err == nil && id == first {
				epoch, known = id, true
			}
		}
		cancel()
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if !tl.verified {
		return true // distrusted or replaced meanwhile: its next check decides
	}
	tl.last = last
	if learn {
		tl.learn = false
		tl.epoch, tl.known = epoch, known
	}
	if tl.known {
		tl.pos = encodeCursor(position{tag: tenantTag(tl.tenant), epoch: tl.epoch, id: tl.last})
	}
	return true
}

// parseEntry reads an entry's hint: task_id and version are required;
// project_id and user_id are dropped when not valid ids (the snapshot
// says).
func parseEntry(tenant string, m redis.XMessage) (fanout.Notification, bool) {
	n := fanout.Notification{TenantID: tenant}
	n.TaskID, _ = m.Values["task_id"].(string)
	v, _ := m.Values["version"].(string)
	var err error
	if n.Version, err = strconv.ParseInt(v, 10, 64); err != nil || n.Version <= 0 || !snapshot.ValidID(n.TaskID) {
		return n, false
	}
	if p, _ := m.Values["project_id"].(string); snapshot.ValidID(p) {
		n.ProjectID = p
	}
	if u, _ := m.Values["user_id"].(string); snapshot.ValidID(u) {
		n.UserID = u
	}
	if o, _ := m.Values["occurred_at"].(string); o != "" {
		n.OccurredAt, _ = strconv.ParseInt(o, 10, 64)
	}
	return n, true
}
