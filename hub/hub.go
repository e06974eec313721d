package hub

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"log/slog"
	"sync"
	"time"

	"github.com/pushd/pushd/internal/episode"
	"github.com/pushd/pushd/internal/flagval"
	"github.com/pushd/pushd/internal/histogram"
	"github.com/pushd/pushd/snapshot"
)

// Bus is the subscription side of a notification bus (fanout.RedisBus,
// fanout.MemoryBus, fanout.ClusterBus). Hub implements the handler a bus
// delivers to (fanout.Handler, fanout.LossHandler, fanout.TenantLossHandler)
// without naming it, so the hub depends on no bus driver.
type Bus interface {
	Subscribe(ctx context.Context, tenantID string) (release func(), err error)
}

// ErrClosed is returned by Open once the hub is draining or closed.
var ErrClosed = errors.New("hub: closed")

// Config configures a Hub. New(Config{Source: s, Bus: b}) works; every other
// zero value has a default.
type Config struct {
	Source snapshot.Source // required
	Bus    Bus             // required
	// Stream, when set, closes the bus's gaps from a replayable log instead
	// of re-reading, and gives resume cursors (see Stream). Nil means none:
	// gaps are closed by re-reading, and resume relies on Subscription.Since.
	Stream Stream
	// RepairInterval is the time between repair rounds, which start at the
	// same instants of the wall clock on every node: the rounds of package
	// converge read it here, and the hub takes a change written more than
	// an interval before a resume cursor for one the resumed client holds
	// (its previous connection's rounds delivered it). Zero means
	// DefaultRepairInterval.
	RepairInterval time.Duration
	// Plans are the plans connections are counted by in ConnCounts; a
	// connection whose token states another counts as PlanOther, one that
	// states none as PlanNone.
	Plans []string

	// Writers is the number of goroutines writing to connections; zero means
	// 32. They never wait for a client: a sink hands what a full socket
	// cannot take to a goroutine of the connection's own (see Sink).
	Writers int
	// Dispatchers bounds concurrent snapshot reads for notifications; zero means 16.
	Dispatchers int
	// FetchTimeout bounds one snapshot read for a notification; zero means 5s.
	FetchTimeout time.Duration
	// HeartbeatInterval is how long a connection may stay silent before a
	// heartbeat is written; zero means 25s.
	HeartbeatInterval time.Duration
	// MaxSubscriptions bounds the tasks plus projects one connection watches;
	// zero means 200.
	MaxSubscriptions int
	// PollInterval is how often watched tasks are re-read while the bus
	// cannot be trusted (polling mode); each wait is jittered by ±20 %.
	// Zero means 2s.
	PollInterval time.Duration
	// MaxPollBackoff caps the wait between polls while no source answers;
	// zero means 30s.
	MaxPollBackoff time.Duration
	// SubscribeReads and SubscribeReadBurst are each user's budget of
	// snapshot reads caused by subscriptions, per node: a token bucket
	// refilling SubscribeReads per second up to SubscribeReadBurst. A task
	// id costs one read unless a connection of the tenant on this node
	// watches it already or the Source has it cached (a reconnect storm
	// reads each task once, whoever asks); a project or user listing costs
	// one. What one of the user's connections watched when it closed is
	// free to watch again for 10 s, so that a client reconnecting with
	// what it holds (an SSE client asking again for refused ids) is
	// charged only for what is new. Ids past it are refused with
	// rate_limit_exceeded and how long to wait.
	// Zero means 50 per second with bursts of 500.
	SubscribeReads     float64
	SubscribeReadBurst int
	// HotTaskWatchers is the number of this node's connections watching one
	// task by id that makes the task hot, the push server's hot key: each
	// time a task reaches it is counted (Stats.HotTasksDetected), again
	// only after it fell below. Zero means 1000.
	HotTaskWatchers int
	// MaxControl bounds queued non-task events (errors) per connection; past
	// it the connection is closed as a slow client. Zero means 256.
	MaxControl int

	// What every transport keeps per connection, read through Hub.Config:
	// here so that each has one home however many transports there are.
	//
	// MaxIDs bounds the tasks plus projects of one request (CheckRequest);
	// zero means 100.
	MaxIDs int
	// SubscribeTimeout bounds the initial reads of one subscription; zero
	// means 10s.
	SubscribeTimeout time.Duration
	// WriteTimeout bounds each write to a client; a client slower than
	// that is disconnected and resyncs on reconnect. Zero means 10s.
	WriteTimeout time.Duration
	// SendBuffer, when positive, sets each connection's socket send buffer
	// (SO_SNDBUF), which bounds what the kernel holds for a client that
	// stopped reading; zero leaves the kernel's autotuning (up to 4 MB a
	// socket on Linux). DefaultConfig sets DefaultSendBuffer.
	SendBuffer int

	// NodeName is shown to clients in hello; zero means "pushd".
	NodeName string
	Logger   *slog.Logger // nil means slog.Default()
}

// RegisterFlags defines on fs a flag for each setting of c an operator
// sets, bound to its field, with the field's value as its default: call it
// on a Config with its defaults (DefaultConfig or WithDefaults).
func (c *Config) RegisterFlags(fs *flag.FlagSet) {
	flagval.Duration(fs, &c.HeartbeatInterval, "heartbeat", "idle time after which a heartbeat is written")
	flagval.Duration(fs, &c.PollInterval, "poll-interval", "while Pub/Sub is down, how often watched tasks are re-read (jittered)")
	flagval.Duration(fs, &c.WriteTimeout, "write-timeout", "a client slower than this per write is disconnected")
	flagval.Duration(fs, &c.RepairInterval, "repair-interval", "how often every watched task is checked against Redis and PostgreSQL (one node of the fleet per task), so a change written and never announced reaches its watchers within this plus 1s; finished tasks every 10th time")
	fs.IntVar(&c.Writers, "writers", c.Writers, "goroutines writing to connections; they never wait for a client (a stalled one's bytes wait on a goroutine of its own), so this bounds CPU only")
	fs.IntVar(&c.MaxSubscriptions, "max-subscriptions", c.MaxSubscriptions, "tasks plus projects one connection may watch; more are refused with too_many_subscriptions")
	fs.IntVar(&c.MaxIDs, "max-ids", c.MaxIDs, "tasks plus projects in one request: an SSE URL (400 past it) or a WebSocket subscribe (bad_request)")
	flagval.Duration(fs, &c.SubscribeTimeout, "subscribe-timeout", "longest the initial reads of one subscription may take")
	fs.Float64Var(&c.SubscribeReads, "subscribe-reads", c.SubscribeReads, "snapshot reads per second that one user's subscriptions may cause on this node (one per task id, project or user scope subscribed), refilling a bucket of --subscribe-read-burst; ids past it get rate_limit_exceeded with retry_after and retry_after_ms")
	fs.IntVar(&c.SubscribeReadBurst, "subscribe-read-burst", c.SubscribeReadBurst, "snapshot reads one user's subscriptions may cause at once on this node")
	fs.IntVar(&c.HotTaskWatchers, "hot-task-watchers", c.HotTaskWatchers, "connections on this node watching one task by id that make it a hot task, counted in hot_key_detected_total each time a task reaches it (again only after it fell below)")
	fs.IntVar(&c.SendBuffer, "socket-send-buffer", c.SendBuffer, "each stream's socket send buffer in bytes (SO_SNDBUF): what the kernel holds for a client that stopped reading, before its bytes wait in pushd and its write timeout runs; 0 leaves the kernel's autotuning (up to 4 MB a socket)")
}

// DefaultSendBuffer is the socket send buffer DefaultConfig gives each
// connection: what a client that stopped reading may hold in the kernel
// before its bytes wait in pushd and its write timeout runs.
const DefaultSendBuffer = 256 << 10

// DefaultConfig is the settings a node runs with unless told otherwise:
// WithDefaults, and a bounded socket send buffer.
func DefaultConfig() Config {
	c := Config{SendBuffer: DefaultSendBuffer}
	return c.WithDefaults()
}

// WithDefaults returns c with each zero setting that has a default set to
// it; it is the one place those defaults are written.
func (c Config) WithDefaults() Config {
	if c.Writers <= 0 {
		c.Writers = 32
	}
	if c.Dispatchers <= 0 {
		c.Dispatchers = 16
	}
	if c.FetchTimeout <= 0 {
		c.FetchTimeout = 5 * time.Second
	}
	if c.HeartbeatInterval <= 0 {
		c.HeartbeatInterval = 25 * time.Second
	}
	if c.MaxSubscriptions <= 0 {
		c.MaxSubscriptions = 200
	}
	if c.PollInterval <= 0 {
		c.PollInterval = 2 * time.Second
	}
	if c.MaxPollBackoff <= 0 {
		c.MaxPollBackoff = 30 * time.Second
	}
	if c.RepairInterval <= 0 {
		c.RepairInterval = DefaultRepairInterval
	}
	if c.SubscribeReads <= 0 {
		c.SubscribeReads = 50
	}
	if c.SubscribeReadBurst <= 0 {
		c.SubscribeReadBurst = 500
	}
	if c.HotTaskWatchers <= 0 {
		c.HotTaskWatchers = 1000
	}
	if c.MaxControl <= 0 {
		c.MaxControl = 256
	}
	if c.MaxIDs <= 0 {
		c.MaxIDs = 100
	}
	if c.SubscribeTimeout <= 0 {
		c.SubscribeTimeout = 10 * time.Second
	}
	if c.WriteTimeout <= 0 {
		c.WriteTimeout = 10 * time.Second
	}
	if c.NodeName == "" {
		c.NodeName = "pushd"
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

// key names a task, project or user within a tenant. Every index is keyed by
// tenant, so nothing heard on one tenant's channel can reach another's
// connections.
type key struct{ tenant, id string }

type connSet map[*Conn]struct{}

// Hub routes snapshots to connections.
type Hub struct {
	cfg Config
	log *slog.Logger
	// initialFails logs the initial reads that fail as episodes: a herd
	// of connections whose reads fail together (a lost node's clients
	// while the sources are slow) would otherwise write a line each, and
	// wait for the log's lock in turn.
	initialFails *episode.Logger

	started time.Time // for sentStamp

	ctx    context.Context // cancelled by Close; parent of fetches
	cancel context.CancelFunc
	wg     sync.WaitGroup // writers, dispatchers, ticker

	idx index // who watches what, sharded

	mu       sync.RWMutex // guards conns, byIP, reserved, classes, plans, closing, empty and every Slot's state
	conns    map[*Conn]struct{}
	byIP     map[string]int    // connections per client address, open or reserved (Slot)
	reserved int               // slots reserved and neither opened nor released
	classes  map[connClass]int // open connections per transport and plan label
	closing  bool
	empty    chan struct{} // closed when closing and the last connection leaves

	modeMu     sync.Mutex // guards mode, modeReason and tenantPolling; taken under a Conn's mu, never the reverse
	mode       string
	modeReason string
	// tenantPolling holds the tenants polled because their shard of the
	// bus is lost, with the reason their connections are told.
	tenantPolling map[string]string

	poll    poller
	budgets readBudgets

	runq     workQueue[*Conn] // connections with something to write
	dispatch dispatchQueue    // tasks to re-read and deliver

	stats counters
}

// New starts a hub. Close or Shutdown stops it.
func New(cfg Config) *Hub {
	cfg = cfg.WithDefaults()
	ctx, cancel := context.WithCancel(context.Background())
	h := &Hub{
		cfg: cfg, log: cfg.Logger, ctx: ctx, cancel: cancel, started: time.Now(),
		initialFails: episode.New(cfg.Logger, "initial reads still failing"),
		conns:        make(map[*Conn]struct{}), byIP: make(map[string]int),
		classes: make(map[connClass]int),
	}
	h.stats.notifyToWrite = histogram.New(notifyToWriteBounds[:]...)
	h.stats.notifyQueued = histogram.New(notifyToWriteBounds[:]...)
	h.stats.notifyRead = histogram.New(notifyToWriteBounds[:]...)
	h.stats.staleness = histogram.New(stalenessBounds[:]...)
	h.stats.repairAge = histogram.New(stalenessBounds[:]...)
	h.idx.init(cfg.HotTaskWatchers)
	h.mode = ModePush
	h.tenantPolling = make(map[string]string)
	h.poll.init()
	h.budgets.init(cfg.SubscribeReads, cfg.SubscribeReadBurst, 4*cfg.MaxSubscriptions)
	h.runq.init()
	h.dispatch.init()
	for range cfg.Writers {
		h.wg.Add(1)
		go h.writeLoop()
	}
	for range cfg.Dispatchers {
		h.wg.Add(1)
		go h.dispatchLoop()
	}
	h.wg.Add(1)
	go h.pollLoop()
	h.wg.Add(1)
	go h.tickLoop()
	return h
}

// Mode is the node's current delivery mode, ModePush or ModePolling, and
// why: polling while the whole bus is lost. On Redis Cluster a lost shard
// makes only its tenants poll (PollingTenants), the node's mode stays push.
func (h *Hub) Mode() (mode, reason string) {
	h.modeMu.Lock()
	defer h.modeMu.Unlock()
	return h.mode, h.modeReason
}

// PollingTenants is the number of tenants polled because their shard of the
// bus is lost (TenantsLost), whatever the node's mode.
func (h *Hub) PollingTenants() int {
	h.modeMu.Lock()
	defer h.modeMu.Unlock()
	return len(h.tenantPolling)
}

// modeOf is the mode of a connection of tenant: the node's while it polls
// every tenant, else the tenant's own.
func (h *Hub) modeOf(tenant string) (mode, reason string) {
	h.modeMu.Lock()
	defer h.modeMu.Unlock()
	if h.mode == ModePolling {
		return h.mode, h.modeReason
	}
	if reason, ok := h.tenantPolling[tenant]; ok {
		return ModePolling, reason
	}
	return ModePush, h.modeReason
}

// setMode records the node's mode and tells every connection whose mode
// that changes.
func (h *Hub) setMode(mode, reason string) {
	h.modeMu.Lock()
	if h.mode == mode && h.modeReason == reason {
		h.modeMu.Unlock()
		return
	}
	if h.mode != mode {
		h.stats.modeSwitches.Add(1)
		h.log.Info("mode changed", "mode", mode, "reason", reason)
	}
	h.mode, h.modeReason = mode, reason
	h.modeMu.Unlock()
	for _, c := range h.allConns() {
		c.syncMode()
	}
}

// setTenantsMode records the mode of tenants whose shard of the bus is lost
// or back, and tells their connections whose mode that changes. With
// keep, a tenant polling already keeps its reason.
func (h *Hub) setTenantsMode(tenants map[string]struct{}, mode, reason string, keep bool) {
	changed := make(map[string]struct{})
	h.modeMu.Lock()
	for t := range tenants {
		old, polling := h.tenantPolling[t]
		switch {
		case mode == ModePush && polling:
			delete(h.tenantPolling, t)
		case mode == ModePolling && (!polling || (old != reason && !keep)):
			h.tenantPolling[t] = reason
		default:
			continue
		}
		changed[t] = struct{}{}
	}
	h.modeMu.Unlock()
	if len(changed) == 0 {
		return
	}
	h.log.Info("tenants' mode changed", "mode", mode, "reason", reason, "tenants", len(changed))
	for _, c := range h.allConns() {
		if _, ok := changed[c.TenantID]; ok {
			c.syncMode()
		}
	}
}

// Principal is who a connection belongs to.
type Principal struct {
	TenantID string
	UserID   string
	// ExpiresAt is when the node stops honouring the token: zero means
	// never; the hub closes the connection when it passes. On a Conn, it
	// and Grant are guarded by Conn.mu: Refresh replaces them.
	ExpiresAt time.Time
	// Hold, when set, is held outside the hub for as long as the connection
	// is open (an admission lease, a session); nil means none.
	Hold Hold
	// Slot, when set, is the connection's place under the node's caps,
	// reserved before it opened (Reserve); Open keeps it and Close gives it
	// back. Nil counts the connection in Len only.
	Slot *Slot
	// RemoteIP is the client's address, for the checks of its tokens.
	RemoteIP string
	// Transport is the protocol the connection speaks, set by the
	// transport; connections and writes are counted by it.
	Transport Transport
	// Deltas says the client applies merge patches: a task event whose
	// version it can reach from the one this connection last sent it
	// carries Event.Patch beside the snapshot, and the transport may
	// write the patch instead.
	Deltas bool
	// Plan is the tenant's plan as the token states it; connections are
	// counted by it (empty counts as PlanNone). A Conn holds the label it
	// is counted under.
	Plan string
	// Grant is what the principal may see inside its tenant besides its
	// own tasks; nil means its own tasks only. Every delivery is checked
	// against it, as against the tenant.
	Grant *snapshot.Grant
}

// Sees reports whether the principal may see s: a task of its tenant
// that its grant allows. Anything else is answered as if it did not exist.
func (p *Principal) Sees(s *snapshot.Snapshot) bool {
	return s.TenantID == p.TenantID && p.Grant.Allows(p.UserID, s)
}

// Hold is something a connection holds outside the hub, such as a fleet-wide
// connection lease. Open calls Attach once it registered the connection (a
// Hold never attached is its caller's to release); Close calls Release once;
// the tick ends the connection as if its token expired once Revoked reports
// true; Refresh calls Rebind with the session the connection's new token
// is (empty for a JWT), so that Revoked answers for the credential the
// connection holds now. Revoked must be cheap and Rebind and Release must
// not block: they run on the hub's paths.
type Hold interface {
	Attach()
	Revoked() bool
	Rebind(session string)
	Release()
}

// Open registers a connection that writes to sink and queues its hello. It
// watches nothing until Subscribe. The transport must call Conn.Close when
// the client goes away.
func (h *Hub) Open(p Principal, sink Sink) (*Conn, error) {
	if p.Transport >= NumTransports {
		p.Transport = TransportUnknown
	}
	c := &Conn{
		ID:        newConnID(),
		Principal: p,
		hub:       h,
		sink:      sink,
	}
	c.lastWrite.Store(time.Now().UnixNano())
	sink.Bind(c)
	h.mu.Lock()
	if h.closing {
		h.mu.Unlock()
		return nil, ErrClosed
	}
	h.conns[c] = struct{}{}
	if s := p.Slot; s != nil && !s.opened && !s.done {
		s.opened = true
		h.reserved--
	}
	c.Plan = h.classLocked(p)
	h.mu.Unlock()
	if p.Hold != nil {
		p.Hold.Attach()
	}
	h.stats.opened.Add(1)
	h.log.Debug("connection opened", "conn", c.ID, "tenant", p.TenantID, "user", p.UserID)
	// The hello states the mode read under c.mu, as syncMode does, with
	// the reason only while it describes the mode (why the connection
	// polls): a reason of push (restored) tells the connections open at
	// the switch what happened; one opened after it has nothing to be told.
	c.mu.Lock()
	mode, reason := h.modeOf(p.TenantID)
	if mode == ModePush {
		reason = ""
	}
	c.toldMode, c.toldReason = mode, reason
	c.sendControlLocked(Event{Kind: KindHello, ConnID: c.ID, Node: h.cfg.NodeName, Mode: mode, Reason: reason,
		HeartbeatMS: h.cfg.HeartbeatInterval.Milliseconds()})
	c.mu.Unlock()
	return c, nil
}

func newConnID() string {
	var b [8]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// Draining reports whether the hub refuses new connections.
func (h *Hub) Draining() bool {
	h.mu.RLock()
	defer h.mu.RUnlock()
	return h.closing
}

// HeartbeatInterval is the configured heartbeat interval.
func (h *Hub) HeartbeatInterval() time.Duration { return h.cfg.HeartbeatInterval }

// Len is the number of open connections.
func (h *Hub) Len() int {
	h.mu.RLock()
	defer h.mu.RUnlock()
	return len(h.conns)
}

// A Slot is a connection counted against the node's caps before it opens,
// so that requests in flight cannot all pass a cap that counts only the
// connections already open: N requests at once against a cap of C hold at
// most C. Reserve takes it; Open, given it in Principal.Slot, keeps it for
// the connection's life and Close gives it back; a Slot never opened is
// its reserver's to Release.
type Slot struct {
	h            *Hub
	ip           string
	opened, done bool // guarded by h.mu; done: released, or its connection closed
}

// A SlotLimit names the cap that refused a Reserve.
type SlotLimit int

const (
	SlotFree    SlotLimit = iota // reserved
	SlotNode                     // the node holds maxConns
	SlotAddress                  // the address holds maxPerIP
)

// Reserve counts one more connection from client address ip, before it
// opens, if the node holds fewer than maxConns connections and ip fewer
// than maxPerIP (zero: no limit), reserved ones included. An empty ip is
// counted in all only.
func (h *Hub) Reserve(ip string, maxConns, maxPerIP int) (*Slot, SlotLimit) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if maxConns > 0 && len(h.conns)+h.reserved >= maxConns {
		return nil, SlotNode
	}
	if maxPerIP > 0 && ip != "" && h.byIP[ip] >= maxPerIP {
		return nil, SlotAddress
	}
	h.reserved++
	if ip != "" {
		h.byIP[ip]++
	}
	return &Slot{h: h, ip: ip}, SlotFree
}

// Release gives back a slot that no connection opened with; once one did,
// it does nothing: the connection's Close gives it back. Idempotent, and
// nil does nothing.
func (s *Slot) Release() {
	if s == nil {
		return
	}
	h := s.h
	h.mu.Lock()
	defer h.mu.Unlock()
	if s.opened || s.done {
		return
	}
	s.done = true
	h.reserved--
	h.uncountLocked(s.ip)
}

// uncountLocked takes one connection from ip's count.
func (h *Hub) uncountLocked(ip string) {
	if ip == "" {
		return
	}
	if h.byIP[ip]--; h.byIP[ip] <= 0 {
		delete(h.byIP, ip)
	}
}

func (h *Hub) allConns() []*Conn {
	h.mu.RLock()
	defer h.mu.RUnlock()
	out := make([]*Conn, 0, len(h.conns))
	for c := range h.conns {
		out = append(out, c)
	}
	return out
}

// Notify queues a notification for delivery. It never blocks: notifications
// of one task that arrive while it waits collapse into the highest version,
// and those no local connection watches are not queued at all, so the queue
// holds at most one entry per watched task. (A connection that starts
// watching later reads the task itself after it is indexed.)
func (h *Hub) Notify(n snapshot.Notification) {
	h.stats.notifications.Add(1)
	h.cfg.Source.Observe(n.TaskID, n.Version)
	k := key{n.TenantID, n.TaskID}
	if !h.watched(k, n.ProjectID, n.UserID) {
		h.stats.dispatchNoWatch.Add(1)
		return
	}
	// Once per notification, however many connections watch the task: the
	// start of the notification-to-write latency of each of them.
	now := time.Now().UnixNano()
	if note := h.idx.noteOf(k); note != nil {
		note.hint(n.Version, now)
	}
	h.dispatch.push(k, n.Version, now)
}

// Resync re-reads every task the tenant's connections watch, bypassing
// caches: the bus may have lost notifications while its subscription was
// down. It only schedules the work, so the bus's loop never waits.
//
// With a Stream that covers the tenant, nothing is re-read: the stream has
// brought every change, those the bus lost included, through Apply.
func (h *Hub) Resync(tenantID string) {
	if h.cfg.Stream != nil && h.cfg.Stream.Covers(tenantID) {
		h.stats.catchUps.Add(1)
		return
	}
	h.stats.resyncs.Add(1)
	h.poll.resync(tenantID)
}

// Close stops the hub at once: every connection is closed and the hub's
// goroutines are waited for. It is idempotent.
func (h *Hub) Close() {
	h.mu.Lock()
	h.closing = true
	h.mu.Unlock()
	for _, c := range h.allConns() {
		c.end(CloseNormal)
	}
	h.cancel()
	h.runq.close()
	h.dispatch.close()
	h.wg.Wait()
}

// Shutdown drains the node: it refuses new connections, tells every client
// to reconnect after a random delay of up to maxAfter (so the fleet is not
// hit by all of them at once), closes connections in batches spread over
// the time ctx allows, and waits for the transports to let go. It then
// closes the hub. It returns ctx's error if connections were still open at
// the deadline; those are closed at once.
func (h *Hub) Shutdown(ctx context.Context, maxAfter time.Duration) error {
	h.mu.Lock()
	h.closing = true
	empty := make(chan struct{})
	if len(h.conns) == 0 {
		close(empty)
	} else {
		h.empty = empty
	}
	h.mu.Unlock()
	conns := h.allConns()
	spread := time.Duration(0)
	if dl, ok := ctx.Deadline(); ok {
		spread = time.Until(dl) / 2 // leave half of the period for the clients to go
	}
	const batches = 10
	per := (len(conns) + batches - 1) / batches
	for i := 0; i < len(conns); i += max(per, 1) {
		for _, c := range conns[i:min(i+max(per, 1), len(conns))] {
			c.drain(maxAfter)
		}
		if spread > 0 && i+per < len(conns) {
			t := time.NewTimer(spread / batches)
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
			}
		}
	}
	var err error
	select {
	case <-empty:
	case <-ctx.Done():
		err = ctx.Err()
	}
	h.Close()
	return err
}
