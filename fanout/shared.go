package fanout

import (
	"context"
	"log/slog"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pushd/pushd/internal/redisx"
)

// What both Redis buses share besides their tenant table (subs.go): how a
// silent connection is probed, how a liveness message's absence is timed,
// and how dropped payloads are counted and logged.

// probe handles a failed receive of a Pub/Sub reading loop. A timeout on a
// connection not yet pinged sends a ping and returns nil: read on. A second
// timeout in a row (pinged still set) is errNoPong. Any other error, or a
// failed ping, is returned: the connection is to be replaced.
func probe(ctx context.Context, ps *redis.PubSub, err error, pinged *bool) error {
	if !redisx.IsTimeout(err) {
		return err
	}
	if *pinged {
		return errNoPong
	}
	if err := ps.Ping(ctx); err != nil {
		return err
	}
	*pinged = true
	return nil
}

// livenessClock times the oldest liveness message acknowledged by Redis and
// not yet known to be heard back. Times are a bus's since() values; the
// zero clock has nothing outstanding.
type livenessClock struct{ sentAt, ackedAt int64 }

// silent reports whether the outstanding message has gone unheard for more
// than timeout since its acknowledgement. heard is when a liveness message
// was last heard or the subscription last (re)made; 0 while it is down, which
// is never called silent (the connection's own failure tells). A message
// heard since the outstanding one was sent clears the clock.
func (c *livenessClock) silent(heard, now, timeout int64) bool {
	if c.sentAt != 0 && heard >= c.sentAt {
		c.sentAt = 0
	}
	return c.sentAt != 0 && heard != 0 && now-c.ackedAt > timeout
}

// acked records a message sent at start and acknowledged at now, unless an
// older one is still outstanding.
func (c *livenessClock) acked(start, now int64) {
	if c.sentAt == 0 {
		c.sentAt, c.ackedAt = start, now
	}
}

// livenessDelay returns d ± 10 %, so nodes do not publish in step.
func livenessDelay(d time.Duration) time.Duration {
	return d - d/10 + rand.N(d/5+1)
}

// dropLog counts dropped payloads and logs them, at debug level, at most
// one line per malformedLogEvery. It is safe for concurrent use.
type dropLog struct {
	mu   sync.Mutex
	last time.Time
	seen int // dropped since the last line
}

func (d *dropLog) drop(log *slog.Logger, stats *redisCounters, reason, channel string, err error) {
	stats.malformed.Add(1)
	stats.malformedBy[slices.Index(malformedReasons[:], reason)].Add(1)
	d.mu.Lock()
	defer d.mu.Unlock()
	d.seen++
	if now := time.Now(); now.Sub(d.last) >= malformedLogEvery {
		log.Debug("dropped malformed notifications", "count", d.seen,
			"last_channel", channel, "last_reason", reason, "last_err", err)
		d.last, d.seen = now, 0
	}
}
