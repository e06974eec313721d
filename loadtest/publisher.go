package main

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/pushd/pushd/fanout"
	"github.com/pushd/pushd/keys"
	"github.com/pushd/pushd/snapshot"
)

// store is where the publisher sends a snapshot: pushd's Redis, or
// Centrifugo's HTTP API. written is false when the store kept a newer
// version and dropped this one.
type store interface {
	store(ctx context.Context, task int, doc []byte) (written bool, err error)
}

// redisStore writes the snapshot and announces it as the Task State
// Service does for pushd (fanout.RedisPublisher): in one round trip on
// standalone Redis; on a cluster (rdb a *redis.ClusterClient, names.Cluster)
// journaled in the tenant's slot, written in the task's, then announced.
type redisStore struct {
	pub    *fanout.RedisPublisher
	reload func() // asks a cluster client to reload the slot map after an error; nil on standalone Redis
}

var _ store = redisStore{}

// newRedisStore writes through rdb; streamMaxLen > 0 appends every change
// to the tenant's stream too, trimmed to about that many entries, which
// nodes with --streams tail and resume clients from.
func newRedisStore(rdb redis.UniversalClient, names keys.Names, streamMaxLen int64) redisStore {
	s := redisStore{pub: fanout.NewRedisPublisher(rdb, names, fanout.WithStream(streamMaxLen))}
	if cc, ok := rdb.(*redis.ClusterClient); ok {
		// go-redis keeps dialing a dead master until it reloads the slot
		// map: after a failover, as soon as a write fails. Reloads run
		// one at a time, however many writes ask.
		s.reload = func() { cc.ReloadState(context.Background()) }
	}
	return s
}

func (s redisStore) store(ctx context.Context, _ int, doc []byte) (bool, error) {
	snap, err := snapshot.Parse(doc)
	if err != nil {
		return false, fmt.Errorf("parse: %w", err)
	}
	written, err := s.pub.Publish(ctx, snap)
	if err != nil && s.reload != nil {
		s.reload()
	}
	return written, err
}

// publisher does what the Task State Service does after a change: update
// the PostgreSQL row, then hand the snapshot to the store, with several
// publishes in flight. Each task belongs to one of its goroutines, so a
// task's versions are stored in order, one after the other, and a server
// that forwards them in order delivers them in order. pgMode says when it
// writes the row: always (before the store, as the service of record
// does), fallback (only when the store failed, so the truth survives an
// outage) or off (rows stay at version 1).
type publisher struct {
	dst     store
	pg      *pgxpool.Pool
	pgMode  string
	tasks   int
	tenants int
	shards  int
	size    int           // pad each snapshot to about this many bytes; 0: no padding
	every   time.Duration // run's schedule tick
	// fromWrite stamps an update when its Redis write begins, not when it
	// was due (-latency-from write).
	fromWrite bool

	lastStored atomic.Int64 // Unix ns when the latest publish was stored

	versions  []int64        // next version to write - 1, per task; owned by the task's shard
	published []atomic.Int64 // newest version stored (the store, or PostgreSQL when it failed), per task
	failed    []atomic.Bool  // per task, on a cluster: the newest version's Redis write failed; nil elsewhere

	attempts  atomic.Int64
	stored    atomic.Int64
	stale     atomic.Int64
	redisErrs atomic.Int64 // the store's errors: Redis, or Centrifugo's API
	pgWrites  atomic.Int64
	pgErrs    atomic.Int64
	lost      atomic.Int64 // changes neither the store nor PostgreSQL took
	retried   atomic.Int64 // writes retryFailed sent again
	slowest   atomic.Int64 // ns, the longest store call (a shard's goroutine waits for it)

	errMu   sync.Mutex
	lastErr string

	// waits is how long each update waited behind its goroutine's earlier
	// publishes, since the last waitWindow: a part of every delivery's
	// latency (sent_ns) that no server under test adds, but the writer's
	// own queue.
	waits durations

	// rowWrites is how long each row's UPDATE took, its commit included:
	// with the row alone, what the latency of record (stamped as the
	// UPDATE runs) holds of PostgreSQL's own commit, fsync and all.
	rowWrites durations

	// The first two stages of every update of a run (runUntil): waited,
	// from its scheduled time to its publish starting, and called, the
	// store call itself (the server's publish API, or Redis's write and
	// PUBLISH), for both servers alike.
	waited, called durations
}

func newPublisher(dst store, pg *pgxpool.Pool, pgMode string, tasks, tenants, shards, size int) *publisher {
	p := &publisher{
		dst: dst, pg: pg, pgMode: pgMode,
		tasks: tasks, tenants: tenants, shards: shards, size: size,
		versions:  make([]int64, tasks),
		published: make([]atomic.Int64, tasks),
	}
	if rs, ok := dst.(redisStore); ok && rs.reload != nil {
		// A task whose newest write hit a dead master would stay behind
		// its row: retryFailed sends it again, as a Task State Service
		// retrying would.
		p.failed = make([]atomic.Bool, tasks)
	}
	return p
}

// lastVersions is the newest stored version of every task.
func (p *publisher) lastVersions() []int64 {
	out := make([]int64, p.tasks)
	for i := range out {
		out[i] = p.published[i].Load()
	}
	return out
}

// setAll records that every task is at version v, written outside the
// publisher (the storm's PostgreSQL update).
func (p *publisher) setAll(v int64) {
	for i := range p.versions {
		p.versions[i] = v
		p.published[i].Store(v)
	}
}

var (
	stages    = []string{"queued", "preprocessing", "provider_submitted", "provider_generating", "upscaling", "post_processing"}
	providers = []string{"veo", "kling", "runway", "luma"}
	models    = []string{"veo-3", "kling-2.1", "gen-4", "ray-2"}
)

// doc is task i's snapshot at version v, about 440 bytes, with sent_ns, an
// extra field pushd forwards untouched, and with p.size a pad field that
// brings it to that size.
func (p *publisher) doc(b []byte, i int, v int64, updated, sent time.Time) []byte {
	start := len(b)
	status, stage, progress, queue := statusOf(v), stages[1+int(v)%(len(stages)-1)], int(v%100), -1
	if v == 1 {
		stage, progress, queue = "queued", 0, i%50
	}
	b = append(b, `{"task_id":"`...)
	b = append(b, taskID(i)...)
	b = append(b, `","tenant_id":"`...)
	b = append(b, tenantOf(i, p.tenants)...)
	b = append(b, `","project_id":"`...)
	b = append(b, projectOf(i, p.tenants)...)
	b = append(b, `","user_id":"`...)
	b = append(b, userOf(i, p.tenants)...)
	b = append(b, `","status":"`...)
	b = append(b, status...)
	b = append(b, `","progress":`...)
	b = strconv.AppendInt(b, int64(progress), 10)
	b = append(b, `,"stage":"`...)
	b = append(b, stage...)
	b = append(b, `","provider":"`...)
	b = append(b, providers[i%len(providers)]...)
	b = append(b, `","model":"`...)
	b = append(b, models[i%len(models)]...)
	b = append(b, `","queue_position":`...)
	if queue >= 0 {
		b = strconv.AppendInt(b, int64(queue), 10)
	} else {
		b = append(b, "null"...)
	}
	b = append(b, `,"preview_asset_id":null,"output_asset_id":null,"error_code":null,"version":`...)
	b = strconv.AppendInt(b, v, 10)
	b = append(b, `,"updated_at":`...)
	b = strconv.AppendInt(b, updated.UnixMilli(), 10)
	b = append(b, `,"sent_ns":`...)
	b = strconv.AppendInt(b, sent.UnixNano(), 10)
	b = append(b, `,"attempt":1,"eta_ms":`...)
	b = strconv.AppendInt(b, int64(100-progress)*900, 10)
	b = append(b, `,"region":"us-east1","worker_pool":"gpu-h100-pool-`...)
	b = strconv.AppendInt(b, int64(i%16), 10)
	b = append(b, `","duration_s":8,"resolution":"1080p"`...)
	if pad := p.size - (len(b) - start) - len(`,"pad":""}`); pad > 0 {
		b = append(b, `,"pad":"`...)
		for range pad {
			b = append(b, 'x')
		}
		b = append(b, '"')
	}
	return append(b, '}')
}

// publish writes task i's next version, due at due: the moment the
// schedule set for it, which the document's sent_ns carries, moved on
// by the row write. Latency then counts the wait behind this goroutine's
// earlier publishes (a store that slows down shows in it, not only in the
// publish rate), but not the row write, which comes before any server can
// know of the change. With fromWrite sent_ns is when the Redis write
// begins, which leaves that wait out.
func (p *publisher) publish(ctx context.Context, i int, due time.Time, buf []byte) []byte {
	v := p.versions[i] + 1
	p.versions[i] = v
	p.attempts.Add(1)
	changed := time.Now()
	p.noteWait(changed.Sub(due))
	if p.pgMode == "only" {
		p.commitAlone(ctx, i, v, changed, due)
		return buf
	}
	pgDone := false
	stamp := due
	if p.pgMode == "always" {
		// The row's write is the Task State Service's, not the server's:
		// latency leaves it out, and only it (a stamp moved by whatever
		// else ran since due would blur the schedule by a preemption).
		began := time.Now()
		pgDone = p.writeRow(ctx, i, v, changed)
		stamp = due.Add(time.Since(began))
	}
	if p.fromWrite {
		stamp = time.Now()
	}
	buf = p.doc(buf[:0], i, v, changed, stamp)
	written, err := p.send(ctx, i, buf)
	switch {
	case err != nil:
		if p.pgMode == "fallback" {
			pgDone = p.writeRow(ctx, i, v, changed)
		}
		if !pgDone {
			p.lost.Add(1)
			return buf
		}
	case !written:
		p.stale.Add(1)
	}
	if p.failed != nil {
		p.failed[i].Store(err != nil) // the row has it: retryFailed sends it again
	}
	p.noteStored(i, v)
	return buf
}

// noteStored counts task i's version v as stored.
func (p *publisher) noteStored(i int, v int64) {
	p.stored.Add(1)
	p.published[i].Store(v)
	// Publishes in flight end in any order: keep the latest.
	now := time.Now().UnixNano()
	for last := p.lastStored.Load(); now > last && !p.lastStored.CompareAndSwap(last, now); last = p.lastStored.Load() {
	}
}

// send hands task i's document to the store, counting and logging a
// failure.
func (p *publisher) send(ctx context.Context, i int, doc []byte) (written bool, err error) {
	pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	start := time.Now()
	written, err = p.dst.store(pctx, i, doc)
	took := int64(time.Since(start))
	cancel()
	p.called.record(time.Duration(took))
	for old := p.slowest.Load(); took > old && !p.slowest.CompareAndSwap(old, took); old = p.slowest.Load() {
	}
	if err != nil {
		p.redisErrs.Add(1)
		p.fail(err.Error())
	}
	return written, err
}

// retryFailed publishes again, as a Task State Service retries a write
// Redis refused, the newest version of every task whose last write failed
// (its PostgreSQL row has it), every 100 ms until Redis takes each or
// timeout passes. Only on a cluster, where a master's failover refuses the
// writes of its slots for a moment; it runs once the publishing stopped,
// so it owns every task.
func (p *publisher) retryFailed(ctx context.Context, timeout time.Duration) {
	if p.failed == nil {
		return
	}
	deadline := time.Now().Add(timeout)
	buf := make([]byte, 0, 512)
	for ctx.Err() == nil {
		pending := 0
		for i := range p.failed {
			if !p.failed[i].Load() {
				continue
			}
			p.retried.Add(1)
			now := time.Now()
			buf = p.doc(buf[:0], i, p.versions[i], now, now)
			if _, err := p.send(ctx, i, buf); err == nil {
				p.failed[i].Store(false)
			} else {
				pending++
			}
		}
		if pending == 0 || time.Now().After(deadline) {
			return
		}
		sleepCtx(ctx, 100*time.Millisecond) // a retry's pause, not synchronization
	}
}

// statusOf is the status of a task at version v: queued when created, then
// running.
func statusOf(v int64) string {
	if v == 1 {
		return "QUEUED"
	}
	return "RUNNING"
}

// writeRow updates task i's row to version v, as the Task State Service
// does before it refreshes Redis.
func (p *publisher) writeRow(ctx context.Context, i int, v int64, at time.Time) bool {
	if p.pg == nil {
		return false
	}
	began := time.Now()
	_, err := p.pg.Exec(ctx, `UPDATE generation_tasks SET version = $2, status = $3, progress = $4, stage = $5, queue_position = NULL, updated_at = $6
		WHERE id = $1 AND version < $2`, taskID(i), v, statusOf(v), int32(v%100), stages[1+int(v)%(len(stages)-1)], at)
	p.rowWrites.record(time.Since(began))
	if err != nil {
		p.pgErrs.Add(1)
		p.fail("postgres: " + err.Error())
		return false
	}
	p.pgWrites.Add(1)
	return true
}

// commitAlone commits task i's row at version v and does nothing else,
// as a Task State Service whose nodes read the changes (-pg-writes only).
// sent_ns, in the row's extra, is when it was due; with fromWrite it is
// PostgreSQL's clock as the UPDATE runs, just before its commit (the
// server runs on this machine, on its clock): the latency of record from
// the commit, without the publisher's wait for a pooled connection.
func (p *publisher) commitAlone(ctx context.Context, i int, v int64, changed, due time.Time) {
	args := []any{taskID(i), v, statusOf(v), int32(v % 100), stages[1+int(v)%(len(stages)-1)], changed}
	sent := `(extract(epoch FROM clock_timestamp()) * 1e9)::bigint`
	if !p.fromWrite {
		sent, args = `$7::bigint`, append(args, due.UnixNano())
	}
	began := time.Now()
	tag, err := p.pg.Exec(ctx, `UPDATE generation_tasks SET version = $2, status = $3, progress = $4, stage = $5, queue_position = NULL,
		updated_at = $6, extra = jsonb_build_object('sent_ns', `+sent+`) WHERE id = $1 AND version < $2`, args...)
	p.rowWrites.record(time.Since(began))
	switch {
	case err != nil:
		p.pgErrs.Add(1)
		p.lost.Add(1)
		p.fail("postgres: " + err.Error())
		return
	case tag.RowsAffected() == 0:
		p.stale.Add(1)
	}
	p.pgWrites.Add(1)
	p.noteStored(i, v)
}

func (p *publisher) noteWait(d time.Duration) {
	p.waited.record(d)
	p.waits.record(d)
}

// stages returns the waits and store calls of the last run's updates
// (nil for none).
func (p *publisher) stages() (waited, called *hdrhistogram.Histogram) {
	return p.waited.get(), p.called.get()
}

// waitWindow returns the waits recorded since the previous call (nil for
// none) and starts a new window.
func (p *publisher) waitWindow() *hdrhistogram.Histogram { return p.waits.take() }

// durations is a histogram that goroutines record durations into, made
// on the first record.
type durations struct {
	mu sync.Mutex
	h  *hdrhistogram.Histogram
}

func (d *durations) record(v time.Duration) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.h == nil {
		d.h = newCoarseHist()
	}
	_ = d.h.RecordValue(max(histMin, min(v.Microseconds(), histMax))) // clamped into range
}

// get returns what was recorded (nil for nothing); read it once the
// recording is done.
func (d *durations) get() *hdrhistogram.Histogram {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.h
}

// quantilesMS reads the quantiles qs (percent) of what was recorded so
// far, in ms; nil for nothing.
func (d *durations) quantilesMS(qs ...float64) []float64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.h == nil {
		return nil
	}
	out := make([]float64, len(qs))
	for i, q := range qs {
		out[i] = float64(d.h.ValueAtQuantile(q)) / 1000
	}
	return out
}

// take returns what was recorded (nil for nothing) and starts anew.
func (d *durations) take() *hdrhistogram.Histogram {
	d.mu.Lock()
	defer d.mu.Unlock()
	h := d.h
	d.h = nil
	return h
}

func (p *publisher) fail(msg string) {
	p.errMu.Lock()
	p.lastErr = msg
	p.errMu.Unlock()
}

// each publishes every task once, as fast as the shards go.
func (p *publisher) each(ctx context.Context) {
	var wg sync.WaitGroup
	for s := range p.shards {
		wg.Go(func() {
			buf := make([]byte, 0, 512)
			for i := s; i < p.tasks; i += p.shards {
				if ctx.Err() != nil {
					return
				}
				buf = p.publish(ctx, i, time.Now(), buf)
			}
		})
	}
	wg.Wait()
}

// publishSet publishes each task of ids once, as fast as the shards go;
// each task goes to the shard that owns it.
func (p *publisher) publishSet(ctx context.Context, ids []int) {
	var wg sync.WaitGroup
	for s := range p.shards {
		wg.Go(func() {
			buf := make([]byte, 0, 512)
			for _, i := range ids {
				if i%p.shards != s {
					continue
				}
				if ctx.Err() != nil {
					return
				}
				buf = p.publish(ctx, i, time.Now(), buf)
			}
		})
	}
	wg.Wait()
}

// pubRun is what one timed run achieved.
type pubRun struct {
	Asked     int64   `json:"asked"`
	Sent      int64   `json:"sent"`
	Seconds   float64 `json:"seconds"`
	PerSecond float64 `json:"per_second"`
	MaxLagMS  float64 `json:"max_schedule_lag_ms"` // how far the dispatcher fell behind the schedule
}

// run publishes rate updates per second for d, round-robin over the tasks
// (update k goes to task k mod tasks at start + k/rate, sent at the first
// tick of p.every after that, its scheduled time), until d passes or ctx
// ends.
func (p *publisher) run(ctx context.Context, rate float64, d time.Duration) pubRun {
	return p.runUntil(ctx, nil, rate, d)
}

// runUntil is run that also ends when stop closes, for a run whose end is
// not known when it starts (-roll's): unlike ctx's end, which fails the
// publishes in flight, stop only ends the schedule, and the updates
// already handed out are published whole. Asked is then what was due.
func (p *publisher) runUntil(ctx context.Context, stop <-chan struct{}, rate float64, d time.Duration) pubRun {
	type update struct {
		task int
		due  time.Time
	}
	p.waited.take() // this run's stages only
	p.called.take()
	chans := make([]chan update, p.shards)
	var wg sync.WaitGroup
	var sent atomic.Int64
	for s := range chans {
		ch := make(chan update, 1024)
		chans[s] = ch
		wg.Go(func() {
			buf := make([]byte, 0, 512)
			for u := range ch {
				buf = p.publish(ctx, u.task, u.due, buf)
				sent.Add(1)
			}
		})
	}
	start := time.Now()
	total := int64(rate * d.Seconds())
	sleeper := newPreciseSleeper()
	var k int64
	var maxLag time.Duration
	for tick := int64(1); k < total; tick++ {
		if ctx.Err() != nil {
			break
		}
		select {
		case <-stop:
			total = k
		default:
		}
		if k >= total {
			break
		}
		sleeper.until(start.Add(time.Duration(tick) * p.every))
		// Woken late (a full shard held the loop up): every tick passed
		// hands its updates out now.
		tick = max(tick, int64(time.Since(start)/p.every))
		for due := dueBy(k, tick, total, rate, p.every); k < due; k++ {
			i := int(k % int64(p.tasks))
			chans[i%p.shards] <- update{i, scheduled(start, k, rate, p.every)}
		}
		if lag := time.Since(start) - time.Duration(float64(k)/rate*float64(time.Second)); lag > maxLag {
			maxLag = lag
		}
	}
	sleeper.stop()
	for _, ch := range chans {
		close(ch)
	}
	wg.Wait()
	el := time.Since(start).Seconds()
	return pubRun{Asked: total, Sent: sent.Load(), Seconds: el, PerSecond: float64(sent.Load()) / el, MaxLagMS: float64(maxLag.Microseconds()) / 1000}
}

// scheduled is when update k of a schedule begun at start is due: the
// first tick of every after k/rate. Latency counts from it, so a publisher
// that falls behind (a full shard, a publish API that pushes back) adds
// its backlog to every update it delays.
func scheduled(start time.Time, k int64, rate float64, every time.Duration) time.Time {
	return start.Add(time.Duration(scheduledTick(k, rate, every)) * every)
}

// scheduledTick is the tick update k is due at: the first after k/rate.
func scheduledTick(k int64, rate float64, every time.Duration) int64 {
	return int64(float64(k)/(rate*every.Seconds())) + 1
}

// dueBy is how many of total updates are due by tick n: k, the updates
// handed out so far, and those after it due at tick n or before. Each
// goes out on its own tick, whatever the rate: counting the updates due
// by the time (rate × elapsed) instead held one back until the next was
// due, 9 ms late at 100 updates/s.
func dueBy(k, n, total int64, rate float64, every time.Duration) int64 {
	for k < total && scheduledTick(k, rate, every) <= n {
		k++
	}
	return k
}

// pubStats is the publisher's whole run.
type pubStats struct {
	Attempts    int64 `json:"attempts"`
	Stored      int64 `json:"stored"`
	Stale       int64 `json:"stale"`
	RedisErrors int64 `json:"redis_errors"`
	PGWrites    int64 `json:"pg_writes"`
	PGErrors    int64 `json:"pg_errors"`
	Lost        int64 `json:"lost"`
	Retried     int64 `json:"retried,omitempty"`
	// SlowestMS is the longest Redis write: while it lasts, its shard's
	// other tasks wait.
	SlowestMS float64 `json:"slowest_write_ms"`
	// RowWriteP50MS and RowWriteP99MS are the row UPDATEs' durations,
	// commit included.
	RowWriteP50MS float64 `json:"row_write_p50_ms,omitempty"`
	RowWriteP99MS float64 `json:"row_write_p99_ms,omitempty"`
	LastError     string  `json:"last_error,omitempty"`
}

func (p *publisher) stats() pubStats {
	p.errMu.Lock()
	s := pubStats{Attempts: p.attempts.Load(), Stored: p.stored.Load(), Stale: p.stale.Load(),
		RedisErrors: p.redisErrs.Load(), PGWrites: p.pgWrites.Load(), PGErrors: p.pgErrs.Load(),
		Lost: p.lost.Load(), Retried: p.retried.Load(), SlowestMS: float64(p.slowest.Load()) / 1e6, LastError: p.lastErr}
	p.errMu.Unlock()
	if q := p.rowWrites.quantilesMS(50, 99); q != nil {
		s.RowWriteP50MS, s.RowWriteP99MS = q[0], q[1]
	}
	return s
}

func (s pubStats) String() string {
	out := fmt.Sprintf("%d published, %d redis errors, %d pg writes, %d lost", s.Stored, s.RedisErrors, s.PGWrites, s.Lost)
	if s.RowWriteP99MS > 0 {
		out += fmt.Sprintf(", row writes p50 %.1f ms p99 %.1f ms", s.RowWriteP50MS, s.RowWriteP99MS)
	}
	return out
}
