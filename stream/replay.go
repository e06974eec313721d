package stream

import (
	"context"
	"errors"

	"github.com/pushd/pushd/snapshot"
	"github.com/pushd/pushd/stream/cursor"
	"github.com/redis/go-redis/v9"
)

// Replay returns the tenant's changes after the cursor resume, oldest
// first, read in one round trip, or the reason (Fallback*) it cannot: the
// caller then sends the client everything, as for a new one. The tenant is the connection's,
// from its token; a cursor never chooses the stream, and a cursor made for
// another tenant's stream is refused by its tag. Replay needs no tail: any
// node answers any node's cursor.
func (t *Tailer) Replay(ctx context.Context, tenant, resume string) ([]snapshot.Notification, string) {
	changes, reason := t.replay(ctx, tenant, resume)
	if reason != "" {
		t.stats.fallback(reason)
		return nil, reason
	}
	t.stats.replays.Add(1)
	t.stats.replayed.Add(int64(len(changes)))
	return changes, ""
}

func (t *Tailer) replay(ctx context.Context, tenant, resume string) ([]snapshot.Notification, string) {
	p, err := cursor.Decode(resume)
	if err != nil {
		return nil, FallbackCorrupt
	}
	if p.Tag != cursor.TenantTag(tenant) {
		return nil, FallbackTenant
	}
	key := t.cfg.Names.Stream(tenant)
	pipe := t.cfg.Client.Pipeline()
	ep := pipe.Get(ctx, t.cfg.Names.StreamEpoch(tenant))
	info := pipe.XInfoStream(ctx, key)
	rng := pipe.XRangeN(ctx, key, "("+p.ID.String(), "+", int64(t.cfg.MaxReplay)+1)
	pipe.Exec(ctx) // each command's error is checked below
	st, err := readState(ep, info)
	switch {
	case err != nil:
		return nil, FallbackUnavailable
	case !st.exists || !st.known || st.epoch != p.Epoch:
		// Gone, or recreated since the cursor was made: Redis lost what
		// came between.
		return nil, FallbackEpoch
	case st.last.Less(p.ID):
		return nil, FallbackAhead
	case st.lost(p.ID):
		return nil, FallbackTrimmed
	}
	msgs, err := rng.Result()
	if err != nil && !errors.Is(err, redis.Nil) {
		return nil, FallbackUnavailable
	}
	if len(msgs) > t.cfg.MaxReplay {
		return nil, FallbackTooMany
	}
	changes := make([]snapshot.Notification, 0, len(msgs))
	for _, m := range msgs {
		if n, ok := parseEntry(tenant, m); ok {
			changes = append(changes, n)
		} else {
			t.stats.malformed.Add(1)
		}
	}
	return changes, ""
}
