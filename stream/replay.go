package stream

import (
	"context"
	"errors"
	"strconv"
	"time"

	"github.com/pushd/pushd/snapshot"
	"github.com/pushd/pushd/stream/cursor"
	"github.com/redis/go-redis/v9"
)

// Replay returns the tenant's changes after the cursor resume, oldest
// first, and those at or before it appended within window before it,
// newest first (what the client holds), read in one round trip, or the
// reason (Fallback*) it cannot: the caller then sends the client
// everything, as for a new one. Each read is bounded by Config.MaxReplay:
// more changes after the cursor is a fallback; more before it are left
// unread, which only costs the caller resends. The tenant is the connection's, from its
// token; a cursor never chooses the stream, and a cursor made for another
// tenant's stream is refused by its tag. Replay needs no tail: any node
// answers any node's cursor.
func (t *Tailer) Replay(ctx context.Context, tenant, resume string, window time.Duration) (after, before []snapshot.Notification, fallback string) {
	after, before, fallback = t.replay(ctx, tenant, resume, window)
	if fallback != "" {
		t.stats.fallback(fallback)
		return nil, nil, fallback
	}
	t.stats.replays.Add(1)
	t.stats.replayed.Add(int64(len(after)))
	t.stats.replayedHeld.Add(int64(len(before)))
	return after, before, ""
}

func (t *Tailer) replay(ctx context.Context, tenant, resume string, window time.Duration) (after, before []snapshot.Notification, fallback string) {
	p, err := cursor.Decode(resume)
	if err != nil {
		return nil, nil, FallbackCorrupt
	}
	if p.Tag != cursor.TenantTag(tenant) {
		return nil, nil, FallbackTenant
	}
	key := t.cfg.Names.Stream(tenant)
	pipe := t.cfg.Client.Pipeline()
	ep := pipe.Get(ctx, t.cfg.Names.StreamEpoch(tenant))
	info := pipe.XInfoStream(ctx, key)
	next := pipe.XRangeN(ctx, key, "("+p.ID.String(), "+", int64(t.cfg.MaxReplay)+1)
	var prior *redis.XMessageSliceCmd
	if window > 0 {
		from := "-"
		if ms := uint64(window.Milliseconds()); p.ID.MS > ms {
			from = strconv.FormatUint(p.ID.MS-ms, 10)
		}
		prior = pipe.XRevRangeN(ctx, key, p.ID.String(), from, int64(t.cfg.MaxReplay))
	}
	pipe.Exec(ctx) // each command's error is checked below
	st, err := readState(ep, info)
	switch {
	case err != nil:
		return nil, nil, FallbackUnavailable
	case !st.exists || !st.known || st.epoch != p.Epoch:
		// Gone, or recreated since the cursor was made: Redis lost what
		// came between.
		return nil, nil, FallbackEpoch
	case st.last.Less(p.ID):
		return nil, nil, FallbackAhead
	case st.lost(p.ID):
		return nil, nil, FallbackTrimmed
	}
	msgs, err := next.Result()
	if err != nil && !errors.Is(err, redis.Nil) {
		return nil, nil, FallbackUnavailable
	}
	if len(msgs) > t.cfg.MaxReplay {
		return nil, nil, FallbackTooMany
	}
	after = t.parseEntries(tenant, msgs)
	if prior != nil {
		// Without them the client is only sent more: not worth a fallback.
		if msgs, err := prior.Result(); err == nil {
			before = t.parseEntries(tenant, msgs)
		}
	}
	return after, before, ""
}

// parseEntries reads a tenant's stream entries, skipping (and counting)
// those without a valid task and version.
func (t *Tailer) parseEntries(tenant string, msgs []redis.XMessage) []snapshot.Notification {
	changes := make([]snapshot.Notification, 0, len(msgs))
	for _, m := range msgs {
		if n, ok := parseEntry(tenant, m); ok {
			changes = append(changes, n)
		} else {
			t.stats.malformed.Add(1)
		}
	}
	return changes
}
