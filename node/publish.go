package node

import (
	"context"
	"sync/atomic"

	"github.com/pushd/pushd/fanout"
	"github.com/pushd/pushd/snapshot"
)

// countingPublisher counts the snapshots its Publisher stored and
// announced (POST /v1/publish, the demo simulator), for
// pubsub_publish_total.
type countingPublisher struct {
	fanout.Publisher
	published atomic.Int64
}

func (p *countingPublisher) Publish(ctx context.Context, s *snapshot.Snapshot) (bool, error) {
	written, err := p.Publisher.Publish(ctx, s)
	if written && err == nil {
		p.published.Add(1)
	}
	return written, err
}

// Published is the number of snapshots stored and announced so far.
func (p *countingPublisher) Published() int64 { return p.published.Load() }
