package fanout

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"time"

	"github.com/pushd/pushd/internal/redisx"
)

// errLivenessMoved replaces a shard whose liveness channel's slot left its
// master.
var errLivenessMoved = errors.New("fanout: the shard's liveness slot moved")

// since returns the time since the bus was made, on the monotonic clock;
// never 0.
func (b *ClusterBus) since() int64 { return max(int64(time.Since(b.epoch)), 1) }

// livenessChannel returns a liveness channel in a slot the master at addr
// serves by the slot map, or "" if none turned up (the map is changing; the
// shard then has its pings until it is replaced). b.mu is held; the lookups
// are in memory.
func (b *ClusterBus) livenessChannel(addr string) string {
	for range 256 {
		ch := b.cfg.Names.Liveness(fmt.Sprintf("%016x", rand.Uint64()))
		if m, err := b.cfg.Client.MasterForKey(b.ctx, ch); err == nil && m.Options().Addr == addr {
			return ch
		}
	}
	return ""
}

// liveness SPUBLISHes on every shard's liveness channel each
// LivenessInterval (jittered), straight to the shard's master, and replaces
// a shard that has not heard a message its master acknowledged for
// LivenessTimeout. A SPUBLISH that fails says nothing about the
// subscription and starts no clock; one answered MOVED means the liveness
// slot left the master, and the shard is replaced without a loss.
func (b *ClusterBus) liveness() {
	defer b.wg.Done()
	clocks := map[*shard]*livenessClock{}
	timeout := int64(b.cfg.LivenessTimeout)
	timer := time.NewTimer(livenessDelay(b.cfg.LivenessInterval))
	defer timer.Stop()
	var seq uint64
	for {
		select {
		case <-timer.C:
		case <-b.ctx.Done():
			return
		}
		b.mu.Lock()
		shards := make([]*shard, 0, len(b.shards))
		for _, sh := range b.shards {
			if sh.live != "" {
				shards = append(shards, sh)
			}
		}
		b.mu.Unlock()
		seq++
		next := make(map[*shard]*livenessClock, len(shards))
		for _, sh := range shards {
			c := clocks[sh]
			if c == nil {
				c = &livenessClock{}
			}
			next[sh] = c
			if c.silent(sh.heardAt.Load(), b.since(), timeout) {
				b.shardFailed(sh, fmt.Errorf("%w within %v", errNoLiveness, b.cfg.LivenessTimeout), false)
				continue
			}
			start := b.since()
			ctx, cancel := context.WithTimeout(b.ctx, b.cfg.LivenessTimeout)
			err := sh.node.SPublish(ctx, sh.live, strconv.FormatUint(seq, 10)).Err()
			cancel()
			switch {
			case b.ctx.Err() != nil:
				return
			case err == nil:
				b.stats.livenessSent.Add(1)
				c.acked(start, b.since())
			case redisx.IsMoved(err):
				b.shardFailed(sh, errLivenessMoved, true)
			default:
				b.stats.livenessFailures.Add(1)
			}
		}
		clocks = next
		timer.Reset(livenessDelay(b.cfg.LivenessInterval))
	}
}
