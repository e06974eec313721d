package main

import (
	"cmp"
	"context"
	"fmt"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/procfs"
	"github.com/redis/go-redis/v9"
)

// fleetMark is what the parts the nodes share had counted at one moment:
// Redis's commands, PostgreSQL's transactions in the run's database, and
// the nodes' own counts of Pub/Sub messages heard, Redis reads and
// PostgreSQL queries. Two marks tell what grows with the node count: at
// idle, per node and minute; under fan-out, per update published.
type fleetMark struct {
	at        time.Time
	redisCmds int64            // total_commands_processed, summed over the masters; -1 unread
	redisBy   map[string]int64 // calls by command, summed over the masters
	pgXacts   int64            // pg_stat_database's commits and rollbacks in the run's database; -1 unread
	pgCPU     int64            // the PostgreSQL server's CPU time, clock ticks; -1 unread (postgresCPU)
	nodeCPU   []int64          // each node's CPU time, clock ticks
	redisCPU  int64            // the Redis servers' CPU time, clock ticks
	m         metrics          // the nodes' /metrics, summed
}

func (r *run) markFleet(ctx context.Context) fleetMark {
	fm := fleetMark{at: time.Now(), redisCmds: -1, pgXacts: -1, pgCPU: -1, nodeCPU: r.nodes.cpu(), m: r.scrape(ctx)}
	if r.redis != nil {
		for _, pid := range r.redis.pids() {
			fm.redisCPU += procCPU(pid)
		}
	}
	if r.rdb != nil {
		fm.redisCmds, fm.redisBy = redisCommands(ctx, r.rdb)
	}
	if r.db != nil {
		// Its own statistics lag the backends' by up to the 1 s they
		// batch their reports in: a difference over a minute is off by
		// a second's worth at most.
		if err := r.db.pool.QueryRow(ctx, `SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = current_database()`).Scan(&fm.pgXacts); err != nil {
			r.logf("pg_stat_database: %v", err)
			fm.pgXacts = -1
		}
		fm.pgCPU = postgresCPU(ctx, r.db.pool)
	}
	return fm
}

// redisCommands is the commands Redis processed, in all and by command,
// summed over a cluster's masters; -1 when one did not answer.
func redisCommands(ctx context.Context, rdb redis.UniversalClient) (int64, map[string]int64) {
	var mu sync.Mutex
	total, by := int64(0), map[string]int64{}
	read := func(ctx context.Context, c *redis.Client) error {
		info, err := c.Info(ctx, "stats", "commandstats").Result()
		mu.Lock()
		defer mu.Unlock()
		if err != nil || total < 0 {
			total = -1
			return nil
		}
		for line := range strings.SplitSeq(info, "\n") {
			line = strings.TrimSpace(line)
			if v, ok := strings.CutPrefix(line, "total_commands_processed:"); ok {
				n, _ := strconv.ParseInt(v, 10, 64)
				total += n
			}
			// cmdstat_get:calls=12,usec=...
			if rest, ok := strings.CutPrefix(line, "cmdstat_"); ok {
				name, stats, _ := strings.Cut(rest, ":")
				calls, _, _ := strings.Cut(strings.TrimPrefix(stats, "calls="), ",")
				n, _ := strconv.ParseInt(calls, 10, 64)
				by[name] += n
			}
		}
		return nil
	}
	if cc, ok := rdb.(*redis.ClusterClient); ok {
		if err := cc.ForEachMaster(ctx, read); err != nil {
			return -1, by
		}
		return total, by
	}
	read(ctx, rdb.(*redis.Client))
	return total, by
}

// topCommands names the commands called most between a and b, at most n,
// with their calls per unit (per node and minute, per update).
func topCommands(a, b map[string]int64, per float64, n int) string {
	type cmd struct {
		name  string
		calls int64
	}
	var cmds []cmd
	for name, calls := range b {
		if d := calls - a[name]; d > 0 {
			cmds = append(cmds, cmd{name, d})
		}
	}
	slices.SortFunc(cmds, func(x, y cmd) int { return cmp.Compare(y.calls, x.calls) })
	var parts []string
	for _, c := range cmds[:min(n, len(cmds))] {
		parts = append(parts, fmt.Sprintf("%s %.1f", c.name, float64(c.calls)/per))
	}
	return strings.Join(parts, ", ")
}

// idleCosts reports what the fleet cost at idle between a and b, per node
// and minute: PostgreSQL queries (repair rounds, scope listings, session
// and lease upkeep: every transaction in the run's database), Redis
// commands, and CPU.
func (r *run) idleCosts(a, b fleetMark) {
	nodes, minutes := float64(len(r.nodes)), b.at.Sub(a.at).Minutes()
	if minutes <= 0 {
		return
	}
	if a.pgXacts >= 0 && b.pgXacts >= 0 {
		// Less the first mark's own read, counted by the second.
		r.res.fig("pg_queries_per_node_per_min", float64(b.pgXacts-a.pgXacts-1)/nodes/minutes, "/node/min", true)
	}
	queries := func(m metrics) float64 { return m["pushd_postgres_queries_total"] + m["pushd_repair_db_queries_total"] }
	r.res.fig("pg_node_counted_queries_per_node_per_min", (queries(b.m)-queries(a.m))/nodes/minutes, "/node/min", false)
	if a.redisCmds >= 0 && b.redisCmds >= 0 {
		r.res.fig("redis_cmds_per_node_per_min_idle", float64(b.redisCmds-a.redisCmds)/nodes/minutes, "/node/min", true)
		r.res.note("redis commands at idle per node and minute: %s", topCommands(a.redisBy, b.redisBy, nodes*minutes, 6))
	}
	if len(a.nodeCPU) == len(b.nodeCPU) {
		var most, sum float64
		for i := range a.nodeCPU {
			pct := float64(b.nodeCPU[i]-a.nodeCPU[i]) / clockTicks / (minutes * 60) * 100
			sum += pct
			most = max(most, pct)
		}
		r.res.fig("node_idle_cpu_pct", sum/nodes, "% of a core", true)
		r.res.fig("node_idle_cpu_pct_max", most, "% of a core", false)
	}
	// Redis's, of the whole fleet: what a connection costs it at idle.
	r.res.fig("redis_idle_cpu_pct", float64(b.redisCPU-a.redisCPU)/clockTicks/(minutes*60)*100, "% of a core", true)
}

// updateCosts reports what each update published cost the fleet between
// a and b: Redis commands (the writer's and the nodes'), the nodes' Redis
// reads, and the Pub/Sub messages they heard, which grow with the node
// count by design: every node hears every hint of a tenant it watches.
func (r *run) updateCosts(a, b fleetMark, updates int64) {
	if updates <= 0 {
		return
	}
	n := float64(updates)
	if a.redisCmds >= 0 && b.redisCmds >= 0 {
		r.res.fig("redis_cmds_per_update", float64(b.redisCmds-a.redisCmds)/n, "/update", true)
		r.res.note("redis commands per update: %s", topCommands(a.redisBy, b.redisBy, n, 6))
	}
	r.res.fig("node_redis_reads_per_update", (b.m["pushd_redis_reads_total"]-a.m["pushd_redis_reads_total"])/n, "/update", true)
	r.res.fig("pubsub_msgs_per_update", (b.m["pushd_pubsub_received_total"]-a.m["pushd_pubsub_received_total"])/n, "/update", true)
	r.res.fig("pg_queries_per_update", (b.m["pushd_postgres_queries_total"]-a.m["pushd_postgres_queries_total"])/n, "/update", false)
	if a.pgCPU >= 0 && b.pgCPU >= 0 {
		// The writer's commits and the nodes' reads alike.
		cpu := float64(b.pgCPU-a.pgCPU) / clockTicks
		r.res.fig("pg_cpu_ms_per_update", cpu*1000/n, "ms", true)
		if secs := b.at.Sub(a.at).Seconds(); secs > 0 {
			r.res.fig("pg_cores", cpu/secs, "cores", true)
		}
	}
}

// connsPerNode reports how many TCP connections each node holds to Redis
// and to PostgreSQL, the most of any node: what a server's client limit
// must allow per node. It reads the sockets' table once, which with a
// million connections takes seconds.
func (r *run) connsPerNode(redisPorts []int) {
	pgPort := 5432
	if u, err := url.Parse(r.cfg.DatabaseURL); err == nil && u.Port() != "" {
		pgPort, _ = strconv.Atoi(u.Port())
	}
	fs, err := procfs.NewDefaultFS()
	if err != nil {
		r.res.warn("connections per node: %v", err)
		return
	}
	//lint:ignore SA1019 the netlink socket query procfs points to would be a new dependency; /proc/net/tcp serves a load generator
	rows, err := fs.NetTCP()
	if err != nil {
		r.res.warn("connections per node: %v", err)
		return
	}
	const established = 1
	toRedis, toPG := map[uint64]bool{}, map[uint64]bool{}
	for _, row := range rows {
		if row.St != established {
			continue
		}
		for _, p := range redisPorts {
			if row.RemPort == uint64(p) {
				toRedis[row.Inode] = true
			}
		}
		if row.RemPort == uint64(pgPort) {
			toPG[row.Inode] = true
		}
	}
	var mostRedis, mostPG int
	for _, s := range r.nodes {
		p := s.current()
		if p == nil || p.exited() {
			continue
		}
		proc, err := fs.Proc(p.pid())
		if err != nil {
			continue
		}
		targets, err := proc.FileDescriptorTargets()
		if err != nil {
			continue
		}
		var nr, np int
		for _, t := range targets {
			ino, ok := socketInode(t)
			switch {
			case !ok:
			case toRedis[ino]:
				nr++
			case toPG[ino]:
				np++
			}
		}
		mostRedis, mostPG = max(mostRedis, nr), max(mostPG, np)
	}
	r.res.fig("redis_conns_per_node_max", float64(mostRedis), "conns", true)
	r.res.fig("pg_conns_per_node_max", float64(mostPG), "conns", true)
}

// socketInode parses a descriptor's target, socket:[12345].
func socketInode(target string) (uint64, bool) {
	s, ok := strings.CutPrefix(target, "socket:[")
	if !ok {
		return 0, false
	}
	n, err := strconv.ParseUint(strings.TrimSuffix(s, "]"), 10, 64)
	return n, err == nil
}
