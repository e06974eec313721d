package fanout

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pushd/pushd/internal/redisx"
)

// read is a shard's reader: the only reader of its connection.
func (b *ClusterBus) read(sh *shard) {
	defer b.wg.Done()
	if b.cfg.LivenessInterval > 0 && !b.subscribeLiveness(sh) {
		return
	}
	pinged := false
	for {
		msg, err := sh.ps.ReceiveTimeout(b.ctx, b.cfg.PingInterval)
		if sh.retired.Load() || b.ctx.Err() != nil {
			return
		}
		if err != nil {
			if err = probe(b.ctx, sh.ps, err, &pinged); err == nil {
				continue
			}
			// A reply that is an error (MOVED, CLUSTERDOWN) answers one of
			// the bus's commands on a connection that works: the slot map
			// moved, not the connection.
			b.shardFailed(sh, err, redisx.IsReply(err))
			return
		}
		pinged = false
		switch m := msg.(type) {
		case *redis.Message:
			if m.Channel == sh.live {
				// Every node publishes on the shard's channel: only this
				// bus's own messages are heard back.
				if strings.HasPrefix(m.Payload, b.id+" ") {
					b.stats.livenessHeard.Add(1)
					sh.heardAt.Store(b.since())
				}
				continue
			}
			b.deliver(m)
		case *redis.Subscription:
			switch {
			case m.Channel == sh.live && m.Kind == "ssubscribe":
				sh.heardAt.Store(b.since()) // the check starts now
			case m.Channel == sh.live && m.Kind == "sunsubscribe":
				// Its slot left this master: a new shard picks another.
				b.shardFailed(sh, errLivenessMoved, true)
				return
			case m.Kind == "ssubscribe":
				b.confirm(sh, m.Channel)
			case m.Kind == "sunsubscribe":
				b.dropped(sh, m.Channel)
			}
		}
	}
}

// subscribeLiveness names the shard's liveness channel and subscribes it,
// before the reader's loop, which tells the channel's messages by its name.
// It reports false when the shard failed (or the
// bus closed): the reader returns.
// A master that serves no slot, or refuses to say which, leaves the shard
// without the check, to its pings: the shard holds no channel for long, or
// the liveness check cannot work there (an ACL refusing CLUSTER NODES).
func (b *ClusterBus) subscribeLiveness(sh *shard) bool {
	ctx, cancel := context.WithTimeout(b.ctx, b.cfg.LivenessTimeout)
	live, ok, err := b.livenessChannel(ctx, sh)
	cancel()
	switch {
	case sh.retired.Load() || b.ctx.Err() != nil:
		return false
	case err != nil && !redisx.IsReply(err):
		b.shardFailed(sh, fmt.Errorf("slots of the shard's master: %w", err), false)
		return false
	case err != nil:
		b.log.Warn("shard without a liveness check: its master did not list its slots", "master", sh.addr, "err", err)
		return true
	case !ok:
		b.log.Debug("shard without a liveness check: its master serves no slot", "master", sh.addr)
		return true
	}
	b.mu.Lock()
	sh.live = live // the liveness goroutine reads it under b.mu
	b.mu.Unlock()
	if err := sh.ps.SSubscribe(b.ctx, live); err != nil {
		if !sh.retired.Load() && b.ctx.Err() == nil {
			b.shardFailed(sh, err, false)
		}
		return false
	}
	return true
}

// confirm handles an ssubscribe confirmation.
func (b *ClusterBus) confirm(sh *shard, channel string) {
	tenant, ok := b.cfg.Names.TenantFromChannel(channel)
	if !ok {
		return
	}
	b.mu.Lock()
	e := b.subs[tenant]
	if e == nil || e.shard != sh || e.placed || e.leaving != nil || e.err != nil {
		b.mu.Unlock() // a reply about a subscription since undone or moved
		return
	}
	e.placed = true
	resync := b.confirmedNow(e)
	restored := e.lost
	last := restored && b.unlostLocked(e)
	hold := resync && b.outage && b.tl == nil
	if hold {
		if b.heldResyncs == nil {
			b.heldResyncs = make(map[string]struct{})
		}
		b.heldResyncs[tenant] = struct{}{} // Restored comes first
	}
	b.mu.Unlock()
	if resync {
		b.stats.resyncs.Add(1)
		b.log.Debug("resubscribed", "tenant", tenant, "master", sh.addr)
	}
	if last {
		b.lost.OK("sharded pubsub restored")
	}
	if restored {
		b.syncLoss([]*tenantSub{e}, resync)
	} else if resync && !hold {
		b.call(func(h Handler) { h.Resync(tenant) })
	}
}

// dropped handles an sunsubscribe: the reply to the bus's own, or the
// master saying it no longer serves the channel's slot.
func (b *ClusterBus) dropped(sh *shard, channel string) {
	tenant, ok := b.cfg.Names.TenantFromChannel(channel)
	if !ok {
		return
	}
	b.mu.Lock()
	e := b.subs[tenant]
	if e == nil || e.shard != sh || e.leaving != nil {
		b.mu.Unlock()
		return
	}
	e.shard, e.placed = nil, false
	e.movedFrom, e.movedAt = sh.addr, time.Now()
	b.mu.Unlock()
	b.log.Info("tenant's slot left its master; resubscribing", "tenant", tenant, "master", sh.addr)
	b.client.ReloadState(b.ctx)
	b.wake()
}

// deliver parses a message and hands it to the handler, or counts and drops
// it.
func (b *ClusterBus) deliver(m *redis.Message) {
	b.stats.received.Add(1)
	n, reason, err := parseMessage(b.cfg.Names, m)
	if err != nil {
		b.drops.drop(b.log, &b.stats, reason, m.Channel, err)
		return
	}
	b.call(func(h Handler) { h.Notify(n) })
}
