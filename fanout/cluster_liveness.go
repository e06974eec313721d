package fanout

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/pushd/pushd/internal/redisx"
)

// errLivenessMoved replaces a shard whose liveness channel's slot left its
// master.
var errLivenessMoved = errors.New("fanout: the shard's liveness slot moved")

// since returns the time since the bus was made, on the monotonic clock;
// never 0.
func (b *ClusterBus) since() int64 { return max(int64(time.Since(b.epoch)), 1) }

// livenessChannel returns the liveness channel of the master of sh: the
// shard channel of the first slot of its first range, as the master itself
// reports its slots (CLUSTER NODES, its "myself" line), so every node names
// a shard's channel alike and the master serves it. ok is false when the
// master serves no slot.
func (b *ClusterBus) livenessChannel(ctx context.Context, sh *shard) (ch string, ok bool, err error) {
	nodes, err := sh.node.ClusterNodes(ctx).Result()
	if err != nil {
		return "", false, err
	}
	slot, ok := firstSlot(nodes)
	if !ok {
		return "", false, nil
	}
	return b.cfg.Names.ShardLiveness(slot), true, nil
}

// firstSlot returns the lowest slot (the first of its first range) that the
// node answering CLUSTER NODES serves, by its own line. Slots it is
// importing or migrating ("[slot-<-id]", "[slot->-id]") are not served.
func firstSlot(clusterNodes string) (int, bool) {
	for line := range strings.Lines(clusterNodes) {
		f := strings.Fields(line)
		if len(f) < 8 || !slices.Contains(strings.Split(f[2], ","), "myself") {
			continue
		}
		first := -1
		for _, r := range f[8:] {
			if strings.HasPrefix(r, "[") {
				continue
			}
			start, _, _ := strings.Cut(r, "-")
			n, err := strconv.Atoi(start)
			if err == nil && n >= 0 && n < 16384 && (first < 0 || n < first) {
				first = n
			}
		}
		if first < 0 {
			return 0, false
		}
		return first, true
	}
	return 0, false
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
			err := sh.node.SPublish(ctx, sh.live, b.id+" "+strconv.FormatUint(seq, 10)).Err()
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
