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
	return &checker{store: b.store, publisher: b.publisher, hold: interval / 2}
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
	switch {
	case err != nil:
	case res.Skipped:
		err = errCheckSkipped
	case res.Slow:
		err = errCheckSlow
	}
	return out, err
}

func (c *checker) publish(ctx context.Context, s *snapshot.Snapshot) error {
	_, err := c.publisher.Publish(ctx, s)
	return err
}
