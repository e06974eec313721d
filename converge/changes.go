package converge

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/redis/go-redis/v9"
	"golang.org/x/sync/errgroup"

	"github.com/pushd/pushd/fanout"
	"github.com/pushd/pushd/keys"
	"github.com/pushd/pushd/snapshot"
	"github.com/pushd/pushd/snapshot/store"
)

// Channel is the PostgreSQL channel of db/migrations/0006_task_changes.sql's
// trigger: a NOTIFY per committed change of a task's version, whose
// payload is the task's id and version.
const Channel = "pushd_task_changes"

// Rows is what the change reader reads from PostgreSQL: a *store.Store.
type Rows interface {
	// Rows reads the rows of ids (at most store.MaxCheck) in a query sent
	// after the call began.
	Rows(ctx context.Context, ids []string) ([]*snapshot.Snapshot, error)
	// ChangedSince lists the rows after (at, afterID) in the order of
	// (updated_at, id), at most limit.
	ChangedSince(ctx context.Context, at time.Time, afterID string, limit int) ([]store.Changed, error)
}

// ChangesConfig configures a ChangeReader. Listen, Rows, Publisher and
// Redis are required.
type ChangesConfig struct {
	// Listen is the configuration of the PostgreSQL connection the reader
	// listens on, its own and outside any pool: a pooled connection would
	// stop listening when returned.
	Listen *pgx.ConnConfig
	// Rows reads the rows the reader publishes.
	Rows Rows
	// Publisher stores a row's snapshot in Redis unless a newer one is
	// there and announces it: the node's, as a Task State Service's.
	Publisher fanout.Publisher
	// Redis holds the reader's lease and the point up to which it heard
	// every change; Names names them (keys.Names.ChangeReader).
	Redis redis.UniversalClient
	Names keys.Names
	// Node names this node in the lease, for operators.
	Node string
	// LeaseTTL is how long the lease outlives its holder's last renewal
	// (renewed every third of it): a node that dies is replaced within
	// it and a second. Zero means 3s.
	LeaseTTL time.Duration
	// Grace is how long a writer's transaction may run between setting
	// its row's updated_at and committing: a reader that takes over lists
	// the changes from this long before the point its predecessor heard
	// everything up to. Zero means 5s.
	Grace time.Duration
	// MaxCatchUp bounds how far back a reader that takes over lists
	// changes: older ones, committed while no reader listened for longer,
	// are left to the repair rounds. Zero means 2m.
	MaxCatchUp time.Duration
	// Logger receives the reader's errors. Nil means slog.Default().
	Logger *slog.Logger
}

// The reader's fixed bounds.
const (
	// flushWindow is how long the reader gathers notifications before it
	// reads their rows: one query for a burst, a few ms of latency.
	flushWindow = 5 * time.Millisecond
	// retryEvery is how often a node not leading tries to take the lease,
	// and how long a reader whose lead failed waits before trying again.
	retryEvery = time.Second
	// publishers bounds the publishes of one flush in flight.
	publishers = 16
	// flushesInFlight bounds the flushes under way at once: the next
	// burst's query and publishes need not wait for a slow master (on
	// Redis Cluster a publish is three round trips) to answer the last's.
	// A task in two of them is safe: the publish stores only what is
	// newer, and announces only what it stored.
	flushesInFlight = 4
	// overlapAfter is how long a burst waits for the flush under way
	// before it starts one beside it. Waiting keeps bursts as large as
	// one flush takes (overlapping at every window cost the fleet a fifth
	// more CPU on Redis Cluster: twice the queries, the nodes reading
	// hints in smaller batches); the bound keeps a slow one from holding
	// back the rest (one cluster run's p99 was 137 ms without it).
	overlapAfter = 20 * time.Millisecond
	// opTimeout bounds each of the reader's PostgreSQL and Redis calls.
	opTimeout = 5 * time.Second
)

func (c ChangesConfig) withDefaults() ChangesConfig {
	if c.LeaseTTL <= 0 {
		c.LeaseTTL = 3 * time.Second
	}
	if c.Grace <= 0 {
		c.Grace = 5 * time.Second
	}
	if c.MaxCatchUp <= 0 {
		c.MaxCatchUp = 2 * time.Minute
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

// ChangeReader is the fleet's one listener to PostgreSQL's committed
// changes of generation_tasks. The node that holds the lease listens on
// Channel, reads the rows the notifications name and publishes each one
// (stored if newer, and announced), so a row committed alone reaches every
// watcher as a Task State Service's publish would. Every node runs one; it
// reads only while its node holds the lease. A reader that takes the lease
// first lists what changed since its predecessor last heard everything
// (ChangesConfig.Grace, MaxCatchUp), so a takeover loses nothing recent.
type ChangeReader struct {
	cfg    ChangesConfig
	lease  *lease
	app    string // the listening connection's application_name
	cancel context.CancelFunc
	done   chan struct{}
	start  sync.Once

	heard, published, stale, caughtUp, leads, failures atomic.Uint64
	leading                                            atomic.Bool
}

// ChangeStats are a ChangeReader's counters since it was made.
type ChangeStats struct {
	Heard     uint64 // notifications received
	Published uint64 // rows stored and announced
	Stale     uint64 // rows Redis held at their version or newer
	CaughtUp  uint64 // rows listed on taking the lease
	Leads     uint64 // times this node took the lease
	Failures  uint64 // leads that ended on an error
	Leading   bool   // this node holds the lease, caught up, and reads notifications now
}

// NewChangeReader makes a reader; Start runs it.
func NewChangeReader(cfg ChangesConfig) *ChangeReader {
	cfg = cfg.withDefaults()
	return &ChangeReader{
		cfg:   cfg,
		lease: newLease(cfg.Redis, cfg.Names, cfg.Node, cfg.LeaseTTL),
		app:   "pushd change reader " + cfg.Names.Prefix,
		done:  make(chan struct{}),
	}
}

// Start runs the reader until Close. It is idempotent.
func (r *ChangeReader) Start() {
	r.start.Do(func() {
		ctx, cancel := context.WithCancel(context.Background())
		r.cancel = cancel
		go r.run(ctx)
	})
}

// Close stops the reader and gives the lease up, so another node takes
// over at once. It is idempotent.
func (r *ChangeReader) Close() {
	r.start.Do(func() { close(r.done) })
	if r.cancel != nil {
		r.cancel()
	}
	<-r.done
}

// Stats returns the counters so far.
func (r *ChangeReader) Stats() ChangeStats {
	return ChangeStats{Heard: r.heard.Load(), Published: r.published.Load(), Stale: r.stale.Load(),
		CaughtUp: r.caughtUp.Load(), Leads: r.leads.Load(), Failures: r.failures.Load(), Leading: r.leading.Load()}
}

func (r *ChangeReader) run(ctx context.Context) {
	defer close(r.done)
	// Failures to take the lease, and leads that fail before they read
	// notifications (PostgreSQL down, or a catch-up Redis will not take),
	// are logged once an episode: either may last long.
	failing, leadFailing := false, false
	for ctx.Err() == nil {
		actx, cancel := context.WithTimeout(ctx, opTimeout)
		token, heard, held, err := r.lease.acquire(actx)
		cancel()
		switch {
		case err != nil && ctx.Err() == nil && !failing:
			r.cfg.Logger.Warn("change reader: taking the lease failed", "err", err)
			failing = true
		case err == nil && failing:
			r.cfg.Logger.Info("change reader: the lease can be taken again")
			failing = false
		}
		if held {
			r.leads.Add(1)
			err := r.lead(ctx, token, heard)
			listened := r.leading.Swap(false)
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), opTimeout)
			_ = r.lease.release(rctx, token)
			cancel()
			if err != nil && ctx.Err() == nil {
				r.failures.Add(1)
				if listened || !leadFailing {
					r.cfg.Logger.Warn("change reader: stopped reading", "err", err)
				}
			}
			leadFailing = err != nil && !listened
		}
		select {
		case <-ctx.Done():
		case <-time.After(retryEvery):
		}
	}
}

// lead listens and publishes while the lease is this node's, after
// catching up from heard.
func (r *ChangeReader) lead(ctx context.Context, token int64, heard time.Time) error {
	conn, err := r.listen(ctx)
	if err != nil {
		return err
	}
	defer closeConn(ctx, conn)
	listening, err := pgNow(ctx, conn)
	if err != nil {
		return err
	}
	if heard.IsZero() {
		// No reader heard anything before: this catch-up lists from Grace
		// before listening, and the next lead, should this one fail, must
		// list from there too, not from Grace before its own.
		heard = listening
	}
	// Connecting took part of the lease's time, and the catch-up may take
	// longer than all of it: each renews it first.
	if err := r.catchUp(ctx, token, heard, listening); err != nil {
		return err
	}
	r.leading.Store(true)
	lctx, cancel := context.WithCancelCause(ctx)
	l := &listener{r: r, conn: conn, token: token, pending: map[string]int64{}, ctx: lctx, fail: cancel,
		slots: make(chan struct{}, flushesInFlight), running: map[uint64]bool{}}
	defer l.flushes.Wait() // every flush ends with the lead, before its connection closes
	defer cancel(nil)      // ends the flushes still under way
	return l.loop(lctx, listening)
}

// listen connects and listens on Channel. A connection that still
// listens under this fleet's name is ended first: its node lost the lease
// (frozen, or cut off from Redis), and while it listens without reading,
// PostgreSQL keeps every notification since for it.
func (r *ChangeReader) listen(ctx context.Context) (*pgx.Conn, error) {
	cfg := r.cfg.Listen.Copy()
	if cfg.RuntimeParams == nil {
		cfg.RuntimeParams = map[string]string{}
	}
	cfg.RuntimeParams["application_name"] = r.app
	cctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	conn, err := pgx.ConnectConfig(cctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("postgres: %w", err)
	}
	if _, err := conn.Exec(cctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity
		WHERE application_name = $1 AND datname = current_database() AND pid <> pg_backend_pid()`, r.app); err != nil && ctx.Err() == nil {
		r.cfg.Logger.Warn("change reader: ending an earlier reader's connection failed", "err", err)
	}
	if _, err := conn.Exec(cctx, "LISTEN "+Channel); err != nil {
		closeConn(ctx, conn)
		return nil, fmt.Errorf("postgres: listen: %w", err)
	}
	return conn, nil
}

// closeConn closes conn, waiting at most opTimeout for PostgreSQL.
func closeConn(ctx context.Context, conn *pgx.Conn) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), opTimeout)
	defer cancel()
	conn.Close(ctx)
}

// pgNow is PostgreSQL's clock, to which updated_at and the heard point
// compare.
func pgNow(ctx context.Context, conn *pgx.Conn) (time.Time, error) {
	ctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	var now time.Time
	if err := conn.QueryRow(ctx, "SELECT now()").Scan(&now); err != nil {
		return time.Time{}, fmt.Errorf("postgres: %w", err)
	}
	return now, nil
}

// catchUp publishes the rows changed from Grace before heard up to
// listening, from MaxCatchUp before listening at the earliest: what was
// committed while no reader listened. Later changes come as
// notifications. Each renewal records heard, which a first lead sets.
func (r *ChangeReader) catchUp(ctx context.Context, token int64, heard, listening time.Time) error {
	from := later(heard.Add(-r.cfg.Grace), listening.Add(-r.cfg.MaxCatchUp))
	after := ""
	for {
		if err := r.renew(ctx, token, heard); err != nil {
			return err
		}
		qctx, cancel := context.WithTimeout(ctx, opTimeout)
		page, err := r.cfg.Rows.ChangedSince(qctx, from, after, store.MaxChanged)
		cancel()
		if err != nil {
			return fmt.Errorf("catch-up: %w", err)
		}
		rows := make([]*snapshot.Snapshot, len(page))
		for i, c := range page {
			rows[i] = c.Snapshot
		}
		r.caughtUp.Add(uint64(len(rows)))
		if err := r.publish(ctx, rows); err != nil {
			return fmt.Errorf("catch-up: %w", err)
		}
		if len(page) < store.MaxChanged || !page[len(page)-1].At.Before(listening) {
			return nil
		}
		from, after = page[len(page)-1].At, page[len(page)-1].Snapshot.TaskID
	}
}

// renew extends the lease, recording heard unless zero.
func (r *ChangeReader) renew(ctx context.Context, token int64, heard time.Time) error {
	ctx, cancel := context.WithTimeout(ctx, min(opTimeout, r.cfg.LeaseTTL))
	defer cancel()
	return r.lease.renew(ctx, token, heard)
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// publish publishes rows, a few at a time. A row Redis holds as another
// tenant's, or under a document it cannot read, is logged and passed:
// no retry would publish it. Any other failure fails the call.
func (r *ChangeReader) publish(ctx context.Context, rows []*snapshot.Snapshot) error {
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(publishers)
	for _, row := range rows {
		g.Go(func() error {
			pctx, cancel := context.WithTimeout(gctx, opTimeout)
			defer cancel()
			written, err := r.cfg.Publisher.Publish(pctx, row)
			switch {
			case errors.Is(err, snapshot.ErrTenantMismatch), errors.Is(err, snapshot.ErrStoredUnreadable):
				r.cfg.Logger.Warn("change reader: a row cannot be published", "task_id", row.TaskID, "err", err)
				return nil
			case err != nil:
				return fmt.Errorf("publish %s: %w", row.TaskID, err)
			case written:
				r.published.Add(1)
			default:
				r.stale.Add(1)
			}
			return nil
		})
	}
	return g.Wait()
}

// listener is one lead's loop over the notifications; the lead's goroutine
// owns it, and the flushes it starts (flush) run until the lead ends.
type listener struct {
	r       *ChangeReader
	conn    *pgx.Conn
	token   int64
	pending map[string]int64 // task ids heard and not yet handed to a flush, by version
	since   time.Time        // when the first of pending was heard

	ctx     context.Context         // the lead's: ended by the first flush that fails
	fail    context.CancelCauseFunc // ends ctx with a flush's error
	slots   chan struct{}           // a token per flush under way
	flushes sync.WaitGroup          // the flushes under way

	started   uint64    // the id of the last flush started (the first is 1)
	points    []settled // settle's points not yet heard in full, oldest first
	mu        sync.Mutex
	running   map[uint64]bool    // the ids of the flushes under way; guarded by mu
	interrupt context.CancelFunc // ends receive's wait, while it waits; guarded by mu
}

// settled is a point of PostgreSQL's clock whose changes are published
// once every flush up to last has ended.
type settled struct {
	at   time.Time
	last uint64
}

// loop reads notifications, publishing them in bursts of flushWindow, and
// renews the lease every third of its TTL with the point up to which every
// change was heard. It returns when the lease is lost, the connection
// fails, or ctx ends.
func (l *listener) loop(ctx context.Context, heard time.Time) error {
	renewEvery := l.r.cfg.LeaseTTL / 3
	renewAt := time.Now()
	for {
		now := time.Now()
		if !now.Before(renewAt) {
			point, err := l.settle(ctx)
			if err != nil {
				return err
			}
			heard = later(heard, point)
			if err := l.r.renew(ctx, l.token, heard); err != nil {
				return err
			}
			renewAt = time.Now().Add(renewEvery)
			continue
		}
		wait := renewAt.Sub(now)
		if len(l.pending) > 0 {
			wait = min(wait, l.due().Sub(now))
		}
		if err := l.receive(ctx, wait); err != nil {
			return err
		}
		if len(l.pending) >= snapshot.MaxMany || (len(l.pending) > 0 && !time.Now().Before(l.due())) {
			if err := l.flush(ctx); err != nil {
				return err
			}
		}
	}
}

// due is when pending goes to a flush: flushWindow after its first
// change, or, while a flush is under way, when that ends, at most
// overlapAfter after its first change.
func (l *listener) due() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.dueLocked()
}

func (l *listener) dueLocked() time.Time {
	if len(l.running) > 0 {
		return l.since.Add(overlapAfter)
	}
	return l.since.Add(flushWindow)
}

// receive waits up to wait for one notification and adds it to pending;
// a flush that ends cuts the wait short, so a burst that waited for it
// goes at once.
func (l *listener) receive(ctx context.Context, wait time.Duration) error {
	// Under the lock a flush ends under, so that its end either came
	// before this wait was set or cuts it short.
	l.mu.Lock()
	if len(l.pending) > 0 {
		wait = min(wait, time.Until(l.dueLocked()))
	}
	wctx, cancel := context.WithTimeout(ctx, max(wait, 0))
	l.interrupt = cancel
	l.mu.Unlock()
	defer cancel()
	defer func() {
		l.mu.Lock()
		l.interrupt = nil
		l.mu.Unlock()
	}()
	n, err := l.conn.WaitForNotification(wctx)
	if n != nil {
		l.add(n)
	}
	switch {
	case err == nil:
		return nil
	case ctx.Err() != nil:
		return context.Cause(ctx) // a flush's error, when one ended the lead
	case wctx.Err() != nil || pgconn.Timeout(err):
		return nil // the wait is over, or a flush ended
	}
	return fmt.Errorf("postgres: %w", err)
}

// add takes a notification's task id and version into pending. A payload
// the trigger would not write is logged and dropped.
func (l *listener) add(n *pgconn.Notification) {
	l.r.heard.Add(1)
	id, v, ok := strings.Cut(n.Payload, " ")
	version, err := strconv.ParseInt(v, 10, 64)
	if !ok || err != nil || !snapshot.ValidID(id) {
		l.r.cfg.Logger.Warn("change reader: a notification pushd cannot read", "payload", n.Payload)
		return
	}
	if len(l.pending) == 0 {
		l.since = time.Now()
	}
	l.pending[id] = max(l.pending[id], version)
}

// settle hands every change heard so far to a flush and returns the
// latest point of PostgreSQL's clock before which every change committed
// is published (zero for none yet): notifications reach a listener before
// the reply to its next statement, so those a point's query brought are in
// the flushes started by then, and the point is heard once those end. It
// waits for no flush: a slow one holds back the point, not the lease.
func (l *listener) settle(ctx context.Context) (time.Time, error) {
	point, err := pgNow(ctx, l.conn)
	if err != nil {
		return time.Time{}, err
	}
	done, cancel := context.WithCancel(ctx)
	cancel()
	for {
		// With done ended, this returns only what the connection holds.
		n, _ := l.conn.WaitForNotification(done)
		if n == nil {
			break
		}
		l.add(n)
	}
	for len(l.pending) > 0 {
		if err := l.flush(ctx); err != nil {
			return time.Time{}, err
		}
	}
	l.points = append(l.points, settled{at: point, last: l.started})
	oldest := uint64(math.MaxUint64) // the first flush still under way
	l.mu.Lock()
	for id := range l.running {
		oldest = min(oldest, id)
	}
	l.mu.Unlock()
	var heard time.Time
	for len(l.points) > 0 && l.points[0].last < oldest {
		heard = l.points[0].at
		l.points = l.points[1:]
	}
	return heard, nil
}

// flush hands up to snapshot.MaxMany pending tasks to a flush of their
// own, which reads their rows and publishes them, once fewer than
// flushesInFlight are under way. A row older than the version heard (a
// writer that took the row back) is published all the same: the publish
// stores nothing older than Redis holds, and the row is the truth. A flush
// that fails ends the lead (its error is ctx's cause): the next reader
// catches up on what it did not publish.
func (l *listener) flush(ctx context.Context) error {
	select {
	case l.slots <- struct{}{}:
	case <-ctx.Done():
		return context.Cause(ctx)
	}
	ids := make([]string, 0, min(len(l.pending), snapshot.MaxMany))
	for id := range l.pending {
		if len(ids) == snapshot.MaxMany {
			break
		}
		ids = append(ids, id)
		delete(l.pending, id)
	}
	l.since = time.Now()
	l.started++
	id := l.started
	l.mu.Lock()
	l.running[id] = true
	l.mu.Unlock()
	l.flushes.Go(func() {
		defer func() {
			<-l.slots
			l.mu.Lock()
			delete(l.running, id)
			if l.interrupt != nil {
				l.interrupt() // a burst that waited for this flush goes now
			}
			l.mu.Unlock()
		}()
		qctx, cancel := context.WithTimeout(l.ctx, opTimeout)
		rows, err := l.r.cfg.Rows.Rows(qctx, ids)
		cancel()
		if err != nil {
			l.fail(fmt.Errorf("read rows: %w", err))
			return
		}
		if err := l.r.publish(l.ctx, rows); err != nil {
			l.fail(err)
		}
	})
	return nil
}
