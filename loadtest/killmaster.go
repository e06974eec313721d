package main

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/redis/go-redis/v9"
)

// masterKill is what fanout with -kill-master did to the cluster: which
// master it killed, when, the tenants whose channel it served and, by task,
// whether it held the task's snapshot.
type masterKill struct {
	addr    string
	at      time.Time
	tenants []string
	keys    []bool // by task: its snapshot key's slot was the master's
}

// publishKillingMaster publishes as fanout does and, halfway through,
// SIGKILLs the master serving tenant t0's channel. It waits for the
// cluster to be whole again (the replica promoted) while the publishing
// goes on, and reports how long that took; once the publishing ends it
// sends again, as a Task State Service retries, every write the dead
// master refused that no later one replaced.
func (r *run) publishKillingMaster(ctx context.Context) (pubRun, *masterKill, error) {
	c, ok := r.redis.(*redisCluster)
	if !ok {
		return pubRun{}, nil, fmt.Errorf("-kill-master needs -cluster")
	}
	kill, err := r.pickMaster(ctx)
	if err != nil {
		return pubRun{}, nil, err
	}
	done := make(chan pubRun, 1)
	go func() { done <- r.pub.run(ctx, r.cfg.Rate, r.cfg.Duration) }()
	if err := sleepCtx(ctx, r.cfg.Duration/2); err != nil {
		return <-done, nil, err
	}
	// The mark first: a snapshot published after it may already miss the
	// master, and counts as one after the kill.
	kill.at = time.Now()
	if err := r.broadcast(command{Cmd: "since", RefNs: kill.at.UnixNano()}); err != nil {
		return <-done, nil, err
	}
	c.node(kill.addr).kill()
	r.logf("killed master %s, serving the channels of %v", kill.addr, kill.tenants)
	if err := c.waitOK(ctx); err != nil {
		r.res.warn("kill-master: %v", err)
	} else {
		r.res.fig("failover_s", time.Since(kill.at).Seconds(), "s", true)
	}
	pr := <-done
	r.pub.retryFailed(ctx, 30*time.Second)
	return pr, kill, nil
}

// pickMaster names the master serving tenant t0's channel, every tenant
// whose channel it serves and every task whose snapshot it holds.
func (r *run) pickMaster(ctx context.Context) (*masterKill, error) {
	cc, ok := r.rdb.(*redis.ClusterClient)
	if !ok {
		return nil, fmt.Errorf("-kill-master needs a cluster client")
	}
	masterOf := func(key string) (string, error) {
		m, err := cc.MasterForKey(ctx, key)
		if err != nil {
			return "", fmt.Errorf("master of %s: %w", key, err)
		}
		return m.Options().Addr, nil
	}
	addr, err := masterOf(r.names.Channel(tenantOf(0, r.cfg.Tenants)))
	if err != nil {
		return nil, err
	}
	k := &masterKill{addr: addr, keys: make([]bool, r.cfg.Tasks)}
	for i := range r.cfg.Tenants {
		t := tenantOf(i, r.cfg.Tenants)
		a, err := masterOf(r.names.Channel(t))
		if err != nil {
			return nil, err
		}
		if a == addr {
			k.tenants = append(k.tenants, t)
		}
	}
	for i := range k.keys {
		a, err := masterOf(r.names.Snapshot(taskID(i)))
		if err != nil {
			return nil, err
		}
		k.keys[i] = a == addr
	}
	return k, nil
}

// The connections after a master kill, by what the dead master held for
// them.
const (
	groupShard     = iota // their tenant's channel: no notification until the failover
	groupKeys             // another tenant's, but their task's snapshot: no write until the failover
	groupUntouched        // neither
)

var groupNames = [3]string{"killed_shard", "killed_keys", "untouched"}

// reportResume collects from the workers when each connection first
// received a snapshot published after the kill, and reports, per group,
// the longest wait: how long deliveries stopped, from the clients' point
// of view (the untouched group waits only for its task's next update). A
// connection that received none by the end of the run fails it.
func (r *run) reportResume(ctx context.Context, k *masterKill) error {
	replies, err := r.all(ctx, func(int) command { return command{Cmd: "resumed"} }, "resumed", 30*time.Second)
	if err != nil {
		return err
	}
	var groups [3]taskResume
	for _, rp := range replies {
		for task, tr := range rp.Resumed {
			g := &groups[groupUntouched]
			switch {
			case slices.Contains(k.tenants, tenantOf(task, r.cfg.Tenants)):
				g = &groups[groupShard]
			case task < len(k.keys) && k.keys[task]:
				g = &groups[groupKeys]
			}
			g.Conns += tr.Conns
			g.Resumed += tr.Resumed
			g.MaxNs = max(g.MaxNs, tr.MaxNs)
		}
	}
	r.res.KilledMaster = &killReport{Addr: k.addr, Tenants: k.tenants, AtS: k.at.Sub(r.start).Seconds()}
	conns, resumed := 0, 0
	for i, g := range groups {
		r.res.KilledMaster.Groups = append(r.res.KilledMaster.Groups, killGroup{Name: groupNames[i], Conns: g.Conns, Resumed: g.Resumed, ResumeS: float64(g.MaxNs) / 1e9})
		r.res.fig(groupNames[i]+"_resume_s", float64(g.MaxNs)/1e9, "s", true)
		conns += g.Conns
		resumed += g.Resumed
	}
	r.res.fig("publish_errors", float64(r.pub.stats().RedisErrors), "", true)
	// Updates go round-robin over the tasks: when the half after the kill
	// has at least one per task, every connection had one to receive.
	everyTask := r.cfg.Rate*r.cfg.Duration.Seconds()/2 >= float64(r.cfg.Tasks)
	if n := conns - resumed; n > 0 && everyTask {
		r.res.fail("KILL-MASTER: %d of %d connections received no snapshot published after the master was killed", n, conns)
	}
	return nil
}
