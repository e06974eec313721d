package fanout

import (
	"fmt"
	"math/rand/v2"
	"net"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"

	"github.com/pushd/pushd/internal/redisx"
)

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
				b.client.ReloadState(b.ctx) // for the next check: the reload is asynchronous
			}
		}
		if b.place(checkAll) {
			backoff = 0
			timer.Reset(b.cfg.CheckInterval)
			continue
		}
		// Something is unplaced: the slot map may be stale (a failover or a
		// migration in progress). Reload it and try again soon.
		b.client.ReloadState(b.ctx)
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
		master, err := b.client.MasterForKey(b.ctx, e.channel)
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
// placed again. With a TenantLossHandler each tenant's loss ends at its
// confirmation instead (confirm).
func (b *ClusterBus) checkRestored() {
	b.mu.Lock()
	if !b.outage || b.closed || b.tl != nil {
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

// shardFailed retires a shard and unplaces what it held, for the placer to
// subscribe again; a connection failure (not a command's error reply) of a
// shard that held confirmed tenants reports Lost.
func (b *ClusterBus) shardFailed(sh *shard, err error, reply bool) {
	b.retire(sh, err, reply)
	b.client.ReloadState(b.ctx)
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
	var tenants []*tenantSub // with tl: the tenants lost now
	for _, e := range b.subs {
		if e.shard == sh {
			e.shard, e.placed = nil, false
			if e.confirmed {
				held++
			}
			if b.tl != nil && e.confirmed && !e.lost && !reply && !b.closed {
				e.lost, e.lostErr = true, err
				b.lostN++
				tenants = append(tenants, e)
			}
		}
	}
	lost := !reply && held > 0 && !b.outage && !b.closed
	during := b.outage
	if b.tl != nil {
		lost = len(tenants) > 0
	}
	if lost {
		b.outage = true
	}
	b.mu.Unlock()
	sh.close()
	if b.ctx.Err() != nil {
		return
	}
	if lost && b.tl != nil {
		b.stats.losses.Add(1)
		b.lost.Fail("sharded pubsub connection lost; resubscribing", err, "master", sh.addr, "tenants", held)
		b.syncLoss(tenants, false)
	} else if lost {
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

// close closes the shard's connection and client; its reader returns.
func (sh *shard) close() {
	sh.retired.Store(true)
	_ = sh.ps.Close()
	_ = sh.client.Close()
}

// unlostLocked ends e's loss and reports whether that ended the last one.
// b.mu is held and e.lost is set.
func (b *ClusterBus) unlostLocked(e *tenantSub) (last bool) {
	e.lost = false
	b.lostN--
	if b.lostN > 0 || !b.outage {
		return false
	}
	b.outage = false
	return true
}

// syncLoss tells the TenantLossHandler the loss of each of es as it stands
// when the handler call runs, not as it stood when scheduled: a shard's
// failure (on the liveness goroutine or the placer) and a confirmation on
// its successor (on the successor's reader) may reach the handler in the
// other order than they changed the state, and the later call must leave
// the handler with the bus's state. With resync, each of es not lost (any
// more) is resynced in the same call, after its TenantsRestored if it had
// one, so no other call comes between; one lost again is resynced at its
// next confirmation.
func (b *ClusterBus) syncLoss(es []*tenantSub, resync bool) {
	b.call(func(h Handler) {
		var lost, back, resynced []string
		var err error
		b.mu.Lock()
		for _, e := range es {
			if resync && !e.lost {
				resynced = append(resynced, e.tenant)
			}
			switch {
			case e.lost && !e.toldLost:
				e.toldLost = true
				lost = append(lost, e.tenant)
				if err == nil {
					err = e.lostErr // the same for every tenant of one shard
				}
			case !e.lost && e.toldLost:
				e.toldLost = false
				back = append(back, e.tenant)
			}
		}
		b.mu.Unlock()
		if len(lost) > 0 {
			b.tl.TenantsLost(lost, err)
		}
		if len(back) > 0 {
			b.tl.TenantsRestored(back)
		}
		for _, tenant := range resynced {
			h.Resync(tenant)
		}
	})
}
