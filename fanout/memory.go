package fanout

import (
	"context"
	"fmt"
	"sync"

	"github.com/pushd/pushd/snapshot"
)

// MemoryBus is the Bus of the embedded mode: one process, no Redis.
// Subscribe is immediate and nothing is ever lost, so it never calls Resync.
//
// Publish delivers on the publisher's goroutine, and only for a tenant with
// at least one reference, as Redis Pub/Sub does: a notification nobody
// listens to is gone. Deliveries are serialized, so a Handler sees one call
// at a time as it does from RedisBus's single reading loop.
type MemoryBus struct {
	deliver sync.Mutex // held while calling h.Notify, and by Close; taken before mu

	mu     sync.Mutex
	h      Handler
	closed bool
	refs   map[string]int // by tenant id; absent when zero
}

var _ Bus = (*MemoryBus)(nil)

// NewMemoryBus returns an empty bus.
func NewMemoryBus() *MemoryBus {
	return &MemoryBus{refs: make(map[string]int)}
}

// Start makes h the receiver of Publish. It must be called once, before
// Subscribe; a second call panics.
func (b *MemoryBus) Start(h Handler) {
	if h == nil {
		panic("fanout: Start with a nil Handler")
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.h != nil {
		panic("fanout: MemoryBus started twice")
	}
	b.h = h
}

// Subscribe takes a reference on tenantID's notifications at once.
func (b *MemoryBus) Subscribe(ctx context.Context, tenantID string) (release func(), err error) {
	if !snapshot.ValidID(tenantID) {
		return nil, fmt.Errorf("subscribe %q: %w", tenantID, snapshot.ErrInvalidID)
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	switch {
	case b.closed:
		return nil, ErrClosed
	case b.h == nil:
		return nil, errNotStarted
	}
	b.refs[tenantID]++
	var once sync.Once
	return func() {
		once.Do(func() {
			b.mu.Lock()
			defer b.mu.Unlock()
			if b.closed {
				return
			}
			if b.refs[tenantID]--; b.refs[tenantID] <= 0 {
				delete(b.refs, tenantID)
			}
		})
	}, nil
}

// Publish hands n to the handler if n's tenant has a subscriber; otherwise,
// or before Start, after Close, or when n has no valid tenant, it drops n.
func (b *MemoryBus) Publish(n snapshot.Notification) {
	b.deliver.Lock()
	defer b.deliver.Unlock()
	b.mu.Lock()
	h := b.h
	listened := !b.closed && b.refs[n.TenantID] > 0
	b.mu.Unlock()
	if h != nil && listened {
		h.Notify(n)
	}
}

// Close stops delivery: once it returns, Publish delivers nothing. It is
// idempotent.
func (b *MemoryBus) Close() error {
	b.deliver.Lock() // waits for a delivery in progress
	defer b.deliver.Unlock()
	b.mu.Lock()
	defer b.mu.Unlock()
	b.closed = true
	clear(b.refs)
	return nil
}
