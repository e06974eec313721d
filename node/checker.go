package node

import (
	"context"
	"errors"
	"time"

	"github.com/pushd/pushd/fanout"
	"github.com/pushd/pushd/hub"
	"github.com/pushd/pushd/snapshot"
	"github.com/pushd/pushd/snapshot/store"
)

// checker is the hub's repair Checker on a Redis mode: the store's Check,
// whose repairs the node's publisher stores and announces, as a Task State
// Service would have.
type checker struct {
	store     *store.Store
	publisher fanout.Publisher
	announcer *fanout.RedisPublisher
	hold      time.Duration
}

// errCheckSkipped and errCheckSlow make the hub back off while PostgreSQL
// is busy or slow.
var (
	errCheckSkipped = errors.New("repair: postgres busy, database part skipped")
	errCheckSlow    = errors.New("repair: postgres slow")
)

// checker is the repair Checker of the backend: nil (no repair) in the
// embedded mode, where nothing is lost. A claim holds for half an interval,
// less than any node's next round.
func (b *backend) checker(interval time.Duration) hub.Checker {
	if b.store == nil {
		return nil
	}
	if interval <= 0 {
		interval = hub.DefaultRepairInterval
	}
	return &checker{store: b.store, publisher: b.publisher, announcer: b.announcer, hold: interval / 2}
}

func (c *checker) Check(ctx context.Context, ids []string, finished bool) (hub.Checked, error) {
	res, err := c.store.Check(ctx, store.CheckRequest{IDs: ids, Hold: c.hold, Finished: finished, Publish: c.publish})
	out := hub.Checked{Found: make([]*snapshot.Snapshot, 0, len(res.Found)), Repaired: res.Repaired}
	repaired := make(map[string]bool, len(res.Repaired))
	for _, s := range res.Repaired {
		repaired[s.TaskID] = true
	}
	for id, s := range res.Found {
		if !repaired[id] {
			out.Found = append(out.Found, s)
		}
	}
	return out, checkErr(err, res.Skipped, res.Slow)
}

// CheckScopes lists the scopes' changes since their last listing, looking
// back a whole interval (twice the hold) behind it.
func (c *checker) CheckScopes(ctx context.Context, scopes []snapshot.Scope) (hub.Checked, error) {
	res, err := c.store.CheckScopes(ctx, store.ScopeCheckRequest{
		Scopes: scopes, Hold: c.hold, LookBack: 2 * c.hold, Publish: c.publish, Announce: c.announcer.Announce,
	})
	return hub.Checked{Found: res.Announced, Repaired: res.Repaired}, checkErr(err, res.Skipped, res.Slow)
}

func checkErr(err error, skipped, slow bool) error {
	switch {
	case err != nil:
		return err
	case skipped:
		return errCheckSkipped
	case slow:
		return errCheckSlow
	}
	return nil
}

func (c *checker) publish(ctx context.Context, s *snapshot.Snapshot) error {
	_, err := c.publisher.Publish(ctx, s)
	return err
}
