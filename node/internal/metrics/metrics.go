// Package metrics exposes a node's counters to Prometheus. It reads the
// counters and histograms the hub, the snapshot store and the bus already
// keep (atomic adds), at scrape time, so the delivery path pays no more
// than those adds for being measured. docs/METRICS.md lists every metric.
//
// Names: the metrics the platform's operators look for by name
// (sse_push_total, websocket_push_total, client_reconnect_total,
// task_snapshot_refetch_total, pubsub_publish_total, the rate_limit_*,
// cache_* and hot_key_detected_total families, stream_length) are exported
// exactly so, beside pushd's own where both exist; every other one starts
// with pushd_.
package metrics

import (
	"iter"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/redis/go-redis/v9"

	"github.com/pushd/pushd/admission"
	"github.com/pushd/pushd/converge"
	"github.com/pushd/pushd/fanout"
	"github.com/pushd/pushd/hub"
	"github.com/pushd/pushd/internal/histogram"
	"github.com/pushd/pushd/snapshot/store"
	"github.com/pushd/pushd/stream"
)

// BusStats is a Redis bus: fanout.RedisBus, or fanout.ClusterBus on Redis
// Cluster.
type BusStats interface{ Stats() fanout.RedisStats }

// PublishStats counts the snapshots a node stored and announced on
// Pub/Sub itself (POST /v1/publish, the demo simulator).
type PublishStats interface{ Published() int64 }

// Sources are what a node measures. Hub is required; Store and Bus are nil
// in the embedded mode, Stream without streams.
type Sources struct {
	Hub       *hub.Hub
	Store     *store.Store
	Bus       BusStats
	Stream    *stream.Tailer
	Admission *admission.Controller // nil: no admission metrics
	Publisher PublishStats          // read only with Bus: nil, or the embedded mode, has no Pub/Sub
	Reconcile ReconcileStats        // nil but on Redis Cluster and split Redis
	Changes   ChangeStats           // nil without --read-changes
	Repair    RepairStats           // nil in the embedded mode
	// RedisPools are the node's Redis clients, each named by the roles it
	// serves ("cache+control+realtime" when one URL serves them all).
	RedisPools map[string]RedisPool
	Postgres   PostgresPool // nil without PostgreSQL
}

// PostgresPool is the node's PostgreSQL connection pool: *pgxpool.Pool.
type PostgresPool interface{ Stat() *pgxpool.Stat }

// RedisPool is a Redis client's connection pool: redis.UniversalClient.
type RedisPool interface{ PoolStats() *redis.PoolStats }

// ReconcileStats is the node's reconcile of the unannounced journal
// (converge.Reconciler).
type ReconcileStats interface {
	Stats() converge.ReconcileStats
}

// RepairStats is the node's repair rounds (converge.Repairer).
type RepairStats interface{ Stats() converge.RepairStats }

// ChangeStats is the node's change reader (converge.ChangeReader).
type ChangeStats interface{ Stats() converge.ChangeStats }

// NewRegistry returns a registry with the Go runtime and process
// collectors and the node's own metrics.
func NewRegistry(s Sources) *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		&collector{s: s},
	)
	return reg
}

type metric struct {
	desc *prometheus.Desc
	typ  prometheus.ValueType
}

func counter(name, help string, labels ...string) metric {
	return metric{prometheus.NewDesc("pushd_"+name, help, labels, nil), prometheus.CounterValue}
}

func gauge(name, help string, labels ...string) metric {
	return metric{prometheus.NewDesc("pushd_"+name, help, labels, nil), prometheus.GaugeValue}
}

// platformCounter is a counter with one of the platform's own names,
// exported without the pushd_ prefix.
func platformCounter(name, help string, labels ...string) metric {
	return metric{prometheus.NewDesc(name, help, labels, nil), prometheus.CounterValue}
}

// platformGauge is platformCounter's gauge.
func platformGauge(name, help string, labels ...string) metric {
	return metric{prometheus.NewDesc(name, help, labels, nil), prometheus.GaugeValue}
}

var (
	connections   = gauge("connections", "Open client connections (SSE and WebSocket).")
	mode          = gauge("mode", "1 for the node's current delivery mode: push (notifications over Pub/Sub) or polling (Pub/Sub down for every tenant). A lost Redis Cluster shard makes only its tenants poll: pushd_polling_tenants.", "mode")
	pollTenants   = gauge("polling_tenants", "Tenants polled because their Redis Cluster shard of the Pub/Sub bus is lost; their connections are told polling, the others' push.")
	modeSwitches  = counter("mode_switches_total", "Switches between push and polling.")
	opened        = counter("connections_opened_total", "Connections opened.")
	notifications = counter("notifications_total", "Change notifications heard.")
	fetches       = counter("notification_fetches_total", "Snapshot reads made for notifications (one per notified task however many watch it).")
	fetchErrors   = counter("notification_fetch_errors_total", "Snapshot reads for notifications that failed.")
	batchedReads  = counter("notification_batched_reads_total", "Reads that served the notifications of several tasks at once (one MGET or pipeline).")
	delivered     = counter("deliveries_total", "Task snapshots written to clients.")
	patches       = counter("patches_total", "Of the task snapshots written, those written as a JSON merge patch from the version the connection last sent (clients that asked for deltas).")
	conflated     = counter("conflated_total", "Pending snapshots replaced by a newer version before a slow client took them.")
	dropped       = counter("dropped_total", "Snapshots not delivered, by reason: stale (not newer than what the client has), tenant (another tenant's) or grant (of a project the connection's token does not grant).", "reason")
	disconnects   = counter("disconnects_total", "Connections the server ended, by reason: slow_client (a write failed or timed out), token_expired, or control_flood (WebSocket pings and pongs past their budget).", "reason")
	heartbeats    = counter("heartbeats_total", "Heartbeats written to idle connections.")
	refreshes     = counter("token_refreshes_total", "Tokens WebSocket connections were refreshed with (the refresh request), accepted.")
	backlogged    = counter("writes_backlogged_total", "Writes a connection's full socket could not take at once, handed to a goroutine of that connection's own instead of holding a shared writer.")
	readsLimited  = counter("subscribe_reads_limited_total", "Subscribed task ids, projects and user scopes refused rate_limit_exceeded because their user's read budget on this node was spent.")
	polls         = counter("polls_total", "Polling rounds (re-reading every watched task while Pub/Sub is down).")
	pollErrors    = counter("poll_errors_total", "Polling rounds in which no source answered for some tasks.")
	resyncs       = counter("resyncs_total", "Tenants re-read after their subscription was re-established.")
	busRetries    = counter("bus_subscribe_retries_total", "Bus subscriptions retried after failing.")

	snapReads    = counter("snapshot_reads_total", "Snapshots answered, by source: cache (in process), redis, postgres.", "source")
	redisReads   = counter("redis_reads_total", "Read round trips to Redis (GET and MGET).")
	redisErrors  = counter("redis_read_errors_total", "Redis reads that failed (the store then fell back to PostgreSQL).")
	pgQueries    = counter("postgres_queries_total", "PostgreSQL fallback queries sent.")
	pgErrors     = counter("postgres_errors_total", "PostgreSQL fallback queries that failed.")
	pgRejected   = counter("postgres_rejected_total", "Reads refused because the cap on concurrent PostgreSQL queries stayed full too long.")
	negativeHits = counter("negative_cache_hits_total", "Reads answered \"not found\" by a negative cache.")
	writeBacks   = counter("writebacks_total", "Snapshots read from PostgreSQL and written back to Redis.")

	pubsubReceived  = counter("pubsub_received_total", "Pub/Sub messages heard.")
	pubsubMalformed = counter("pubsub_malformed_total", "Pub/Sub messages dropped as malformed, by reason.", "reason")
	pubsubFailures  = counter("pubsub_failures_total", "Pub/Sub connection failures (failed receives, missing pongs, liveness drops).")
	livenessSent    = counter("liveness_sent_total", "Liveness messages the node published to itself.")
	livenessHeard   = counter("liveness_heard_total", "Liveness messages heard back.")

	streamsTailed   = gauge("streams_tailed", "Tenant streams the node tails (tenants with watchers here).")
	streamsPolled   = gauge("streams_polled", "Of the tailed streams, on Redis Cluster, those read by polling once per block timeout: their master already has --stream-cluster-reads blocking reads from this node.")
	streamLength    = gauge("stream_length_entries", "Entries in the streams the node tails, as of their last check: the sum, and the longest.", "stat")
	streamEntries   = counter("stream_entries_total", "Stream entries read and delivered to the hub.")
	streamReads     = counter("stream_reads_total", "XREAD calls, by result: ok or error.", "result")
	streamRechecks  = counter("stream_rechecks_total", "Times a stream reader checked its tails again before reading on, because a read failed or ran on a new connection (a restarted or promoted Redis).")
	streamMalformed = counter("stream_malformed_total", "Stream entries skipped for lacking a valid task_id or version.")
	streamCatchUps  = counter("stream_catchups_total", "Pub/Sub gaps (lost subscription, resubscribed tenant) the stream closed without re-reading.")
	tailResyncs     = counter("stream_tail_resyncs_total", "Tenants re-read because their tail could not continue, by reason: trimmed, epoch (stream recreated), backwards (stream lost), start.", "reason")
	resumes         = counter("resumes_total", "SSE reconnects with a stream cursor that were served by replaying the stream.")
	replayed        = counter("resume_replayed_entries_total", "Stream entries replayed for resuming clients.")
	replayedHeld    = counter("resume_held_entries_total", "Stream entries at or before resuming clients' cursors, within the repair interval plus 1 s, read to learn which versions those clients hold.")
	resumeTasks     = counter("resume_tasks_total", "Tasks read for resuming clients because the stream holds a change of them after the cursor; each is sent unless the client holds its current version.")
	resumeFallbacks = counter("resume_fallbacks_total", "Resume cursors not replayed, so the client got a full resync, by reason: corrupt, tenant, epoch, trimmed, too_many, ahead, unavailable, subscription.", "reason")
	admAllowed      = counter("admission_allowed_total", "Rate-limit checks passed, by rule: connect_user, connect_ip (buckets), api (plan window), user_cap, tenant_cap (connection caps), conns_per_ip, auth_failures (the node's own per-address limits).", "rule")
	admRejected     = counter("admission_rejected_total", "Connections and API calls refused (429), by rule.", "rule")
	admFallbacks    = counter("admission_fallbacks_total", "Admission checks decided on local limits because the control Redis failed or had just failed.")
	admStoreErrors  = counter("admission_store_errors_total", "Round trips to the control Redis that failed (checks, renewals, releases, reconciles).")
	admStoreUp      = gauge("admission_store_up", "1 while admission uses the control Redis, 0 while it uses local limits.")
	leases          = gauge("admission_leases", "Connection leases this node holds.")
	leaseEvents     = counter("admission_lease_events_total", "Connection lease events: acquired, released, expired (purged unrenewed), readded (renewals that found a lease missing).", "event")
	reconciles      = counter("admission_reconciles_total", "Tenants whose connection counts were rebuilt from live leases.")
	reconcileDiff   = counter("admission_reconcile_difference_total", "Sum of |count - live leases| the reconciles repaired.")
	sessionsClosed  = counter("admission_sessions_revoked_total", "Sessions found deleted or expired on re-validation; their connections were closed.")
	admPolls        = counter("admission_polls_total", "Fallback polls (snapshot reads marked X-Pushd-Poll) by outcome: free, within their user's poll bucket and not charged to the tenant's API window; charged, past it and checked against the window like any call.", "outcome")
	streamLag       = prometheus.NewDesc("pushd_stream_lag_seconds", "Time from a stream entry's append (its id) to its delivery to the node's connections' outboxes.", nil, nil)

	connsOpen    = gauge("connections_open", "Open client connections by transport (sse, websocket) and tenant plan (free, pro, enterprise; none when the token states none; other for any other).", "transport", "plan")
	reconnects   = platformCounter("client_reconnect_total", "Connections that came back with a resume position: SSE with a Last-Event-ID (header or last_event_id) that parses as a cursor, WebSocket with a non-empty since on a subscribe. Once per connection.", "transport")
	refetch      = platformCounter("task_snapshot_refetch_total", "Task snapshot lookups by source (local_cache, redis, postgres) and outcome (hit, miss, not_found, error, skipped, pool_wait, rejected); see docs/METRICS.md.", "source", "outcome")
	sfShared     = counter("singleflight_shared_total", "Snapshot reads that joined a fetch already in flight for the same task or list instead of starting one.")
	pubsubLosses = counter("pubsub_subscription_losses_total", "Times the Pub/Sub subscription was lost (each outage once; on Redis Cluster each lost shard once); the node polls its tenants until it is back.")
	notifyWrite  = prometheus.NewDesc("pushd_notification_to_write_seconds", "Time from the node hearing a change notification to the write of the snapshot it announced, per task event written.", nil, nil)
	notifyQueued = prometheus.NewDesc("pushd_notification_queued_seconds", "Time from the node hearing a change notification to a dispatcher taking its task to read, per notified task read: the first stage of pushd_notification_to_write_seconds.", nil, nil)
	notifyRead   = prometheus.NewDesc("pushd_notification_read_seconds", "Time a dispatcher's read of notified tasks' snapshots took, per read (a batch of tasks read together counts once): the second stage of pushd_notification_to_write_seconds.", nil, nil)
	staleness    = prometheus.NewDesc("pushd_snapshot_staleness_seconds", "Time from a snapshot's updated_at to its write to a client, per task event of a change (notification, poll, stream), not of a subscription's initial state. Includes clock skew with the Task State Service.", nil, nil)

	rlAllowed    = platformCounter("rate_limit_allowed_total", "Rate-limit checks passed, by endpoint (connect, or the snapshot API's task, tasks, project_tasks) and rule_name (connect_user, connect_ip, api, user_cap, tenant_cap, conns_per_ip, auth_failures); only rules that are on are checked.", "endpoint", "rule_name")
	rlRejected   = platformCounter("rate_limit_rejected_total", "Connections and API calls refused with 429, by endpoint and the rule_name that refused.", "endpoint", "rule_name")
	rlRetryAfter = prometheus.NewDesc("rate_limit_retry_after_ms", "The wait each refusal asked for (Retry-After, in milliseconds), by endpoint and rule_name.", []string{"endpoint", "rule_name"}, nil)
	rlLatency    = prometheus.NewDesc("rate_limit_lua_latency_ms", "Time of each round trip to the control Redis that ran a rule's Lua script, answered or failed, in milliseconds, by endpoint and rule_name; a round trip that checked two rules counts under each.", []string{"endpoint", "rule_name"}, nil)
	cacheHit     = platformCounter("cache_hit_total", "Snapshot reads a cache answered, a \"not found\" marker included, by cache: local (in process) or redis (in front of PostgreSQL).", "cache")
	cacheMiss    = platformCounter("cache_miss_total", "Snapshot reads a cache could not answer, so the next layer was asked, by cache: local or redis.", "cache")
	cacheSet     = platformCounter("cache_set_total", "Entries stored in a cache by the read path: local (snapshots and listings read, or written, stored in process) or redis (snapshots read from PostgreSQL written back).", "cache")
	hotDetected  = platformCounter("hot_key_detected_total", "Times a task became hot: watched by id by --hot-task-watchers of the node's connections (counted again only after it fell below).")
	hotTasks     = gauge("hot_tasks", "Tasks hot now: watched by id by --hot-task-watchers of the node's connections or more.")
	unwatched    = counter("notifications_unwatched_total", "Change notifications heard for tasks no connection on the node watches, dropped without a read.")
	published    = platformCounter("pubsub_publish_total", "Snapshots the node stored and announced on Pub/Sub itself (POST /v1/publish, the demo simulator).")
	streamLen    = platformGauge("stream_length", "Entries in the streams the node tails, as of their last check: the sum, and the longest (the same as pushd_stream_length_entries).", "stat")
	applyErrors  = counter("stream_apply_errors_total", "Batches of stream entries the hub could not deliver (a snapshot read failed); the batch is read again.")

	repairRounds    = counter("repair_rounds_total", "Repair rounds run: every watched task checked against Redis and, for the tasks this node claimed for the fleet, PostgreSQL.")
	repairLast      = gauge("repair_last_round_timestamp_seconds", "Unix time of the start of the repair slot whose round ended last, 0 before the first: a node more than twice the repair interval behind has stopped repairing (it polls, or backs off from a busy PostgreSQL).")
	repairErrors    = counter("repair_errors_total", "Repair rounds in which a check failed (Redis or PostgreSQL did not answer, the PostgreSQL slots were busy, or its PostgreSQL part took over a second); the next round waits twice as long, up to 8 intervals.")
	repairs         = counter("repairs_total", "Changes never announced that a repair round delivered, by what it found: database_newer (PostgreSQL newer than Redis and the last check; this node published it for the fleet), redis_newer (a connection here held an older version than Redis's), not_held (a connection here held none).", "found")
	repairChecked   = counter("repair_checked_total", "Tasks this node claimed for the fleet and checked against PostgreSQL.")
	repairQueries   = counter("repair_db_queries_total", "PostgreSQL queries of the repair rounds: versions of the claimed tasks, and rows of the changes found newer.")
	repairRows      = counter("repair_db_rows_total", "Rows the repair rounds' PostgreSQL queries read.")
	repairSkipped   = counter("repair_db_skipped_total", "Checks whose PostgreSQL part was skipped: half of the node's PostgreSQL slots or more were busy, or it failed.")
	repairScopes    = counter("repair_scopes_listed_total", "Watched project and user scopes this node claimed for the fleet and listed the changes of.")
	repairAnnounced = counter("repair_announced_total", "Changes a scope listing found in Redis in PostgreSQL's version and announced again: most had been announced already.")
	repairAge       = prometheus.NewDesc("pushd_repair_age_seconds", "Time from a repaired change's updated_at to the repair round that delivered it (the repairs of pushd_repairs_total). Includes clock skew with the Task State Service.", nil, nil)

	reconcileRounds    = counter("announce_reconcile_rounds_total", "Rounds of the reconcile of the unannounced journal of the tenants watched here (Redis Cluster and split Redis only).")
	reconcileRepairs   = counter("announce_repairs_total", "Announcements the reconcile made of a stored snapshot whose publisher never announced it (died or failed between the write and the announcement).")
	reconcileAbandoned = counter("announce_abandoned_total", "Unannounced journal entries the reconcile removed because their version was never stored (the publisher died before the write).")
	reconcileErrors    = counter("announce_reconcile_errors_total", "Reconcile rounds in which a Redis read or a repair failed; the entries stay for the next round.")

	changesRead    = counter("changes_read_total", "Changes of generation_tasks this node's change reader took, by how: heard (a notification), caught_up (listed on taking the lease: committed while no reader listened).", "how")
	changesOut     = counter("changes_published_total", "Rows the change reader read and published, by outcome: stored (and announced), or stale (Redis held that version or a newer one).", "outcome")
	changesLeads   = counter("change_reader_leads_total", "Times this node took the fleet's change-reader lease, and (outcome=failed) leads that ended on an error: PostgreSQL or Redis failed, or the lease was lost.", "outcome")
	changesLeading = gauge("change_reader_leading", "1 while this node holds the fleet's change-reader lease and listens to PostgreSQL, else 0.")

	poolWaits       = counter("redis_pool_waits_total", "Redis commands that waited for a free connection of their client's pool and got one, by client (the roles it serves) and pool (main, or pipeline: the pipelines' own).", "client", "pool")
	poolWaitSeconds = counter("redis_pool_wait_seconds_total", "Time the commands of redis_pool_waits_total spent waiting.", "client", "pool")
	poolTimeouts    = counter("redis_pool_timeouts_total", "Redis commands that gave up waiting for a free connection of their client's pool at its pool timeout. A command whose own deadline passed first counts in neither.", "client", "pool")
	poolConns       = gauge("redis_pool_connections", "Connections in a Redis client's pool, by state: open (every one) or idle.", "client", "pool", "state")
	pgPoolWaits     = counter("postgres_pool_waits_total", "PostgreSQL queries that waited for a connection of the node's pool.")
	pgPoolWaitSecs  = counter("postgres_pool_wait_seconds_total", "Time PostgreSQL queries spent waiting for a connection of the node's pool.")
	pgPoolConns     = gauge("postgres_pool_connections", "Connections of the node's PostgreSQL pool, by state: open, idle, or max (the most it opens).", "state")

	all = []metric{connections, mode, pollTenants, modeSwitches, opened, notifications, fetches, batchedReads, fetchErrors, delivered, patches, conflated,
		dropped, disconnects, heartbeats, refreshes, backlogged, readsLimited, polls, pollErrors, resyncs, busRetries,
		snapReads, redisReads, redisErrors, pgQueries, pgErrors, pgRejected, negativeHits, writeBacks,
		pubsubReceived, pubsubMalformed, pubsubFailures, livenessSent, livenessHeard,
		streamsTailed, streamsPolled, streamLength, streamEntries, streamReads, streamRechecks, streamMalformed, streamCatchUps, tailResyncs,
		resumes, replayed, replayedHeld, resumeTasks, resumeFallbacks,
		admAllowed, admRejected, admFallbacks, admStoreErrors, admStoreUp, leases, leaseEvents, reconciles, reconcileDiff, sessionsClosed,
		connsOpen, reconnects, refetch, sfShared, pubsubLosses,
		rlAllowed, rlRejected, cacheHit, cacheMiss, cacheSet, hotDetected, hotTasks, unwatched, published, streamLen, applyErrors,
		reconcileRounds, reconcileRepairs, reconcileAbandoned, reconcileErrors,
		changesRead, changesOut, changesLeads, changesLeading,
		repairRounds, repairLast, repairErrors, repairs, repairChecked, repairQueries, repairRows, repairSkipped, repairScopes, repairAnnounced,
		poolWaits, poolWaitSeconds, poolTimeouts, poolConns, pgPoolWaits, pgPoolWaitSecs, pgPoolConns}
)

// pushed is each transport's counter of the task events written to its
// connections: the one metric of a transport's own, one row a transport.
var pushed = [hub.NumTransports]metric{
	hub.TransportSSE:       platformCounter("sse_push_total", "Task events written to SSE connections."),
	hub.TransportWebSocket: platformCounter("websocket_push_total", "Task events written to WebSocket connections."),
}

// transports are the transports clients connect over: every one but
// hub.TransportUnknown.
func transports() iter.Seq[hub.Transport] {
	return func(yield func(hub.Transport) bool) {
		for t := hub.TransportUnknown + 1; t < hub.NumTransports; t++ {
			if !yield(t) {
				return
			}
		}
	}
}

type collector struct{ s Sources }

func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, m := range all {
		ch <- m.desc
	}
	for t := range transports() {
		ch <- pushed[t].desc
	}
	ch <- streamLag
	ch <- notifyWrite
	ch <- notifyQueued
	ch <- notifyRead
	ch <- staleness
	ch <- repairAge
	ch <- rlRetryAfter
	ch <- rlLatency
}

// Collect reads each source's Stats, plain values, and maps them to
// metrics, one function per source.
func (c *collector) Collect(ch chan<- prometheus.Metric) {
	e := emitter{ch}
	hs := c.s.Hub.Stats()
	e.hub(hs)
	if c.s.Store != nil {
		e.store(c.s.Store.Stats())
	}
	if c.s.Repair != nil {
		e.repair(hs, c.s.Repair.Stats())
	}
	if c.s.Bus != nil {
		e.bus(c.s.Bus.Stats())
		if c.s.Publisher != nil {
			e.emit(published, float64(c.s.Publisher.Published()))
		}
	}
	if c.s.Stream != nil {
		e.stream(c.s.Stream.Stats(), hs)
	}
	if a := c.s.Admission; a != nil {
		e.admission(a.Stats())
	}
	for name, p := range c.s.RedisPools {
		ps := p.PoolStats()
		e.pool(name, "main", ps)
		if ps.PipelineStats != nil {
			e.pool(name, "pipeline", (*redis.PoolStats)(ps.PipelineStats))
		}
	}
	if p := c.s.Postgres; p != nil {
		st := p.Stat()
		e.emit(pgPoolWaits, float64(st.EmptyAcquireCount()))
		e.emit(pgPoolWaitSecs, st.EmptyAcquireWaitTime().Seconds())
		e.emit(pgPoolConns, float64(st.TotalConns()), "open")
		e.emit(pgPoolConns, float64(st.IdleConns()), "idle")
		e.emit(pgPoolConns, float64(st.MaxConns()), "max")
	}
	if r := c.s.Reconcile; r != nil {
		rs := r.Stats()
		e.emit(reconcileRounds, float64(rs.Rounds))
		e.emit(reconcileRepairs, float64(rs.Repairs))
		e.emit(reconcileAbandoned, float64(rs.Abandoned))
		e.emit(reconcileErrors, float64(rs.Errors))
	}
	if r := c.s.Changes; r != nil {
		cs := r.Stats()
		e.emit(changesRead, float64(cs.Heard), "heard")
		e.emit(changesRead, float64(cs.CaughtUp), "caught_up")
		e.emit(changesOut, float64(cs.Published), "stored")
		e.emit(changesOut, float64(cs.Stale), "stale")
		e.emit(changesLeads, float64(cs.Leads), "taken")
		e.emit(changesLeads, float64(cs.Failures), "failed")
		leading := 0.0
		if cs.Leading {
			leading = 1
		}
		e.emit(changesLeading, leading)
	}
}

// emitter sends a scrape's metrics.
type emitter struct{ ch chan<- prometheus.Metric }

func (e emitter) emit(m metric, v float64, labels ...string) {
	e.ch <- prometheus.MustNewConstMetric(m.desc, m.typ, v, labels...)
}

// histogram sends a histogram's snapshot, in seconds.
func (e emitter) histogram(d *prometheus.Desc, s histogram.Snapshot) {
	buckets := make(map[float64]uint64, len(s.Bounds))
	for i, b := range s.Bounds {
		buckets[b.Seconds()] = s.Cumulative[i]
	}
	e.ch <- prometheus.MustNewConstHistogram(d, s.Count, s.Sum.Seconds(), buckets)
}

// histogramMS sends a histogram's snapshot in milliseconds, for the
// platform's _ms names.
func (e emitter) histogramMS(d *prometheus.Desc, s histogram.Snapshot, labels ...string) {
	ms := func(v time.Duration) float64 { return float64(v) / float64(time.Millisecond) }
	buckets := make(map[float64]uint64, len(s.Bounds))
	for i, b := range s.Bounds {
		buckets[ms(b)] = s.Cumulative[i]
	}
	e.ch <- prometheus.MustNewConstHistogram(d, s.Count, ms(s.Sum), buckets, labels...)
}

func (e emitter) hub(st hub.Stats) {
	e.emit(connections, float64(st.Conns))
	for _, m := range []string{hub.ModePush, hub.ModePolling} {
		e.emit(mode, boolf(m == st.Mode), m)
	}
	e.emit(pollTenants, float64(st.PollingTenants))
	e.emit(modeSwitches, float64(st.ModeSwitches))
	e.emit(opened, float64(st.Opened))
	e.emit(notifications, float64(st.Notifications))
	e.emit(fetches, float64(st.Fetches))
	e.emit(batchedReads, float64(st.BatchedReads))
	e.emit(fetchErrors, float64(st.FetchErrors))
	e.emit(delivered, float64(st.Delivered))
	e.emit(patches, float64(st.Patches))
	e.emit(conflated, float64(st.Conflated))
	for d := range hub.NumDrops {
		e.emit(dropped, float64(st.Dropped[d]), d.String())
	}
	cuts := make(map[string]int64, hub.NumCuts) // reasons may share a label
	for r := range hub.NumCuts {
		cuts[r.String()] += st.Cuts[r]
	}
	for label, n := range cuts {
		e.emit(disconnects, float64(n), label)
	}
	e.emit(heartbeats, float64(st.Heartbeats))
	e.emit(refreshes, float64(st.Refreshes))
	e.emit(backlogged, float64(st.Backlogged))
	e.emit(readsLimited, float64(st.ReadsLimited))
	e.emit(polls, float64(st.Polls))
	e.emit(pollErrors, float64(st.PollErrors))
	e.emit(resyncs, float64(st.Resyncs))
	e.emit(busRetries, float64(st.BusRetries))
	e.emit(unwatched, float64(st.DispatchNoWatch))
	e.emit(hotDetected, float64(st.HotTasksDetected))
	e.emit(hotTasks, float64(st.HotTasks))
	for _, cc := range st.ConnCounts {
		e.emit(connsOpen, float64(cc.N), cc.Transport.String(), cc.Plan)
	}
	for t := range transports() {
		e.emit(pushed[t], float64(st.Pushed[t]))
		e.emit(reconnects, float64(st.Reconnects[t]), t.String())
	}
	e.histogram(notifyWrite, st.NotifyToWrite)
	e.histogram(notifyQueued, st.NotifyQueued)
	e.histogram(notifyRead, st.NotifyRead)
	e.histogram(staleness, st.Staleness)
}

// repair is the repair rounds', on a node with a store: the repairer's
// rounds and checks, and what the hub delivered of them.
func (e emitter) repair(st hub.Stats, rs converge.RepairStats) {
	e.emit(repairRounds, float64(rs.Rounds))
	last := 0.0 // before the first round
	if !rs.Slot.IsZero() {
		last = float64(rs.Slot.UnixMilli()) / 1e3
	}
	e.emit(repairLast, last)
	e.emit(repairErrors, float64(rs.Errors))
	e.emit(repairs, float64(rs.Repaired), "database_newer")
	e.emit(repairs, float64(st.RepairOlder), "redis_newer")
	e.emit(repairs, float64(st.RepairUnheld), "not_held")
	e.emit(repairChecked, float64(rs.Checked))
	e.emit(repairQueries, float64(rs.CheckQueries))
	e.emit(repairRows, float64(rs.CheckRows))
	e.emit(repairSkipped, float64(rs.CheckSkipped))
	e.emit(repairScopes, float64(rs.ScopesListed))
	e.emit(repairAnnounced, float64(rs.Announced))
	e.histogram(repairAge, st.RepairAge)
}

func (e emitter) store(ss store.Stats) {
	e.emit(snapReads, float64(ss.CacheHits), "cache")
	e.emit(snapReads, float64(ss.RedisHits), "redis")
	e.emit(snapReads, float64(ss.DBQueries-ss.DBErrors), "postgres")
	e.emit(redisReads, float64(ss.RedisReads))
	e.emit(redisErrors, float64(ss.RedisErrors))
	e.emit(pgQueries, float64(ss.DBQueries))
	e.emit(pgErrors, float64(ss.DBErrors))
	e.emit(pgRejected, float64(ss.DBRejected))
	e.emit(negativeHits, float64(ss.NegativeHits))
	e.emit(writeBacks, float64(ss.WriteBacks))
	e.emit(refetch, float64(ss.CacheHits), "local_cache", "hit")
	e.emit(refetch, float64(ss.CacheMisses), "local_cache", "miss")
	e.emit(refetch, float64(ss.NegativeHits-ss.RedisNegative), "local_cache", "not_found")
	e.emit(refetch, float64(ss.RedisHits), "redis", "hit")
	e.emit(refetch, float64(ss.RedisMisses-ss.RedisNegative), "redis", "miss")
	e.emit(refetch, float64(ss.RedisNegative), "redis", "not_found")
	e.emit(refetch, float64(ss.RedisErrors), "redis", "error")
	e.emit(refetch, float64(ss.RedisSkipped), "redis", "skipped")
	e.emit(refetch, float64(ss.RedisPoolWaits), "redis", "pool_wait")
	e.emit(refetch, float64(ss.DBHits), "postgres", "hit")
	e.emit(refetch, float64(ss.DBMisses), "postgres", "miss")
	e.emit(refetch, float64(ss.DBErrors), "postgres", "error")
	e.emit(refetch, float64(ss.DBRejected), "postgres", "rejected")
	e.emit(sfShared, float64(ss.SharedCalls))
	// A "not found" marker answered the read as well as a snapshot would.
	e.emit(cacheHit, float64(ss.CacheHits+ss.NegativeHits-ss.RedisNegative), "local")
	e.emit(cacheMiss, float64(ss.CacheMisses), "local")
	e.emit(cacheSet, float64(ss.CacheSets), "local")
	e.emit(cacheHit, float64(ss.RedisHits+ss.RedisNegative), "redis")
	e.emit(cacheMiss, float64(ss.RedisMisses-ss.RedisNegative), "redis")
	e.emit(cacheSet, float64(ss.WriteBacks), "redis")
}

func (e emitter) bus(bs fanout.RedisStats) {
	e.emit(pubsubReceived, float64(bs.Received))
	for reason, n := range bs.MalformedBy {
		e.emit(pubsubMalformed, float64(n), reason)
	}
	e.emit(pubsubFailures, float64(bs.Failures))
	e.emit(pubsubLosses, float64(bs.Losses))
	e.emit(livenessSent, float64(bs.LivenessSent))
	e.emit(livenessHeard, float64(bs.LivenessHeard))
}

// stream maps the tailer's stats and the hub's stream-side counters, which
// exist only with a stream.
func (e emitter) stream(ts stream.Stats, hs hub.Stats) {
	e.emit(streamsTailed, float64(ts.Tailed))
	e.emit(streamsPolled, float64(ts.Polled))
	e.emit(streamLength, float64(ts.Length), "sum")
	e.emit(streamLength, float64(ts.MaxLength), "max")
	e.emit(streamLen, float64(ts.Length), "sum")
	e.emit(streamLen, float64(ts.MaxLength), "max")
	e.emit(applyErrors, float64(ts.ApplyErrors))
	e.emit(streamEntries, float64(ts.Entries))
	e.emit(streamReads, float64(ts.Reads), "ok")
	e.emit(streamReads, float64(ts.ReadErrors), "error")
	e.emit(streamRechecks, float64(ts.Rechecks))
	e.emit(streamMalformed, float64(ts.Malformed))
	e.emit(streamCatchUps, float64(hs.CatchUps))
	for reason, n := range ts.TailResyncs {
		e.emit(tailResyncs, float64(n), reason)
	}
	e.emit(resumes, float64(hs.Resumes))
	e.emit(replayed, float64(ts.Replayed))
	e.emit(replayedHeld, float64(ts.ReplayedHeld))
	e.emit(resumeTasks, float64(hs.ResumeTasks))
	for reason, n := range ts.ResumeFallbacks {
		e.emit(resumeFallbacks, float64(n), reason)
	}
	// Refused before the stream saw them: issued for another subscription.
	e.emit(resumeFallbacks, float64(hs.ResumeMismatches), "subscription")
	e.histogram(streamLag, ts.Lag)
}

// pool sends one pool's counts. go-redis keeps them in 32 bits: a counter
// that wraps reads as a reset.
func (e emitter) pool(client, pool string, ps *redis.PoolStats) {
	e.emit(poolWaits, float64(ps.WaitCount), client, pool)
	e.emit(poolWaitSeconds, time.Duration(ps.WaitDurationNs).Seconds(), client, pool)
	e.emit(poolTimeouts, float64(ps.Timeouts), client, pool)
	e.emit(poolConns, float64(ps.TotalConns), client, pool, "open")
	e.emit(poolConns, float64(ps.IdleConns), client, pool, "idle")
}

func (e emitter) admission(as admission.Stats) {
	for rule, n := range as.Allowed {
		e.emit(admAllowed, float64(n), rule)
	}
	for rule, n := range as.Rejected {
		e.emit(admRejected, float64(n), rule)
	}
	e.emit(admFallbacks, float64(as.Fallbacks))
	e.emit(admStoreErrors, float64(as.StoreErrors))
	e.emit(admStoreUp, boolf(as.StoreUp))
	e.emit(leases, float64(as.Leases))
	e.emit(leaseEvents, float64(as.LeasesAcquired), "acquired")
	e.emit(leaseEvents, float64(as.LeasesReleased), "released")
	e.emit(leaseEvents, float64(as.LeasesExpired), "expired")
	e.emit(leaseEvents, float64(as.LeasesReadded), "readded")
	e.emit(reconciles, float64(as.Reconciles))
	e.emit(reconcileDiff, float64(as.ReconcileDiff))
	e.emit(sessionsClosed, float64(as.SessionsClosed))
	e.emit(admPolls, float64(as.PollsFree), "free")
	e.emit(admPolls, float64(as.PollsCharged), "charged")
	for _, r := range as.Rules {
		e.emit(rlAllowed, float64(r.Allowed), r.Endpoint, r.Rule)
		e.emit(rlRejected, float64(r.Rejected), r.Endpoint, r.Rule)
		e.histogramMS(rlRetryAfter, r.RetryAfter, r.Endpoint, r.Rule)
		e.histogramMS(rlLatency, r.LuaLatency, r.Endpoint, r.Rule)
	}
}

func boolf(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
