// Package fanout carries "task changed" notifications between the Task State
// Service and pushd nodes: the Redis Pub/Sub bus (one connection per node,
// subscriptions reference-counted per tenant), the in-memory bus of the
// embedded mode, and the publisher a Task State Service imports.
//
// Together with keys and snapshot, this package is the public API for Task
// State Services written in Go: Publisher, NewRedisPublisher and its options
// stay stable. The buses are public too, but only the pushd node uses them.
package fanout

import (
	"context"
	"errors"
	"fmt"

	jsonv2 "github.com/go-json-experiment/json"

	"github.com/pushd/pushd/snapshot"
)

// MaxNotificationSize bounds a notification payload; larger ones are dropped.
const MaxNotificationSize = 4 << 10

// ErrMalformed marks a notification payload that was dropped.
var ErrMalformed = errors.New("malformed notification")

// ParseNotification decodes a payload heard on tenant's channel. task_id and
// version are required.
func ParseNotification(tenantID string, payload []byte) (snapshot.Notification, error) {
	n, _, err := parseNotification(tenantID, payload)
	return n, err
}

// Reasons a heard payload is dropped, the keys of RedisStats.MalformedBy.
const (
	reasonChannel   = "channel" // not a change channel of this prefix, or an invalid tenant
	reasonSize      = "size"
	reasonJSON      = "json"
	reasonTaskID    = "task_id"
	reasonVersion   = "version"
	reasonProjectID = "project_id"
	reasonUserID    = "user_id"
)

// malformedReasons lists every reason; RedisBus counts by index in it.
var malformedReasons = [...]string{
	reasonChannel, reasonSize, reasonJSON, reasonTaskID, reasonVersion, reasonProjectID, reasonUserID,
}

// parseNotification is ParseNotification, also saying why a payload was
// rejected so a bus can count drops by reason.
func parseNotification(tenantID string, payload []byte) (snapshot.Notification, string, error) {
	var n snapshot.Notification
	if len(payload) > MaxNotificationSize {
		return n, reasonSize, fmt.Errorf("%w: %d bytes", ErrMalformed, len(payload))
	}
	if err := jsonv2.Unmarshal(payload, &n); err != nil {
		return n, reasonJSON, fmt.Errorf("%w: %v", ErrMalformed, err)
	}
	if !snapshot.ValidID(n.TaskID) {
		return n, reasonTaskID, fmt.Errorf("%w: task_id", ErrMalformed)
	}
	if n.Version <= 0 {
		return n, reasonVersion, fmt.Errorf("%w: version", ErrMalformed)
	}
	if n.ProjectID != "" && !snapshot.ValidID(n.ProjectID) {
		return n, reasonProjectID, fmt.Errorf("%w: project_id", ErrMalformed)
	}
	if n.UserID != "" && !snapshot.ValidID(n.UserID) {
		return n, reasonUserID, fmt.Errorf("%w: user_id", ErrMalformed)
	}
	n.TenantID = tenantID
	return n, "", nil
}

// Handler receives what a bus hears. Its methods are called from the bus's
// reading loop and must not block.
type Handler interface {
	// Notify is called once per well-formed notification.
	Notify(snapshot.Notification)
	// Resync is called when a tenant's subscription was re-established after
	// a loss: notifications sent meanwhile may be gone, so the handler
	// re-reads what it watches.
	Resync(tenantID string)
}

// LossHandler may also be implemented by a Handler that wants to hear when
// a bus's subscription stops being trustworthy and when it works again, to
// switch between push and polling (docs/DESIGN.md, "Failure modes"). Its
// methods are called from the bus's reading loop, as Handler's are, one call
// at a time, and must not block.
//
// For one outage the calls come in this order:
//
//  1. Lost(err), once, at the first failure after a healthy period: the
//     connection or its dial failed (also at Start, when Redis is down from
//     the beginning), a ping went unanswered, or the bus did not hear its own
//     liveness message back (err then says "liveness"). From then on any
//     tenant's notifications may be missed: poll what is watched.
//  2. Restored(), once, at the first message read after Lost: go-redis has
//     redialed and re-sent SUBSCRIBE for every channel. No Notify is called
//     between Lost and Restored; Notify may resume right after Restored.
//  3. Resync(tenant), for each tenant whose subscription had been confirmed
//     before, as its confirmation arrives on the new connection; changes
//     published after that reach Notify. Resyncs of several tenants come in
//     no particular order, and Notify calls may come between them.
//
// A tenant subscribed for the first time during an outage gets no Resync (its
// Subscribe returns at its confirmation, or fails); a tenant whose last
// reference was released during an outage may get none. If the connection
// fails again before every Resync arrived, Lost comes again and the missing
// Resyncs follow the next Restored. Restored never comes without a Lost
// before it. Resync may also come without Lost and Restored: when a Subscribe
// or a linger's UNSUBSCRIBE finds the connection broken, go-redis redials and
// resubscribes on its own, before the reading loop sees any failure.
type LossHandler interface {
	// Lost says the bus's subscription cannot be trusted any more
	// (connection failed, pong or liveness missing). Called once per outage.
	Lost(err error)
	// Restored says the Pub/Sub connection works again after a Lost: go-redis
	// has redialed and re-sent SUBSCRIBE for every channel; Resync(tenant)
	// follows for each tenant as its confirmation arrives. Called once per
	// outage, after Lost.
	Restored()
}

// TenantLossHandler may also be implemented by a LossHandler that wants to
// hear a bus's losses per tenant: on Redis Cluster one shard's connection
// fails while the others work, and only the tenants placed on it may miss
// notifications. The ClusterBus then calls these instead of Lost and
// Restored; a bus with one connection (RedisBus) always calls Lost and
// Restored, since its loss is every tenant's. The methods are called as
// LossHandler's are: from the bus's goroutines, one call at a time (Handler
// calls included), and must not block.
//
// For one shard's outage the calls come in this order:
//
//  1. TenantsLost(tenants, err), once, with the tenants confirmed on the
//     shard whose connection failed (connection, ping or liveness: as for
//     Lost), those of them already lost left out. From then on their
//     notifications may be missed: poll what they watch. The other
//     tenants' notifications keep coming. A failure of every master comes
//     as one TenantsLost per shard.
//  2. TenantsRestored([]string{tenant}) then Resync(tenant), one after the
//     other, as each lost tenant's resubscription is confirmed on the
//     master that owns its slot now; changes published after that reach
//     Notify. TenantsRestored also ends, without a Resync, the loss of a
//     tenant whose last reference was released and whose linger ran out
//     during the outage: nothing of it stays subscribed.
//
// TenantsRestored never names a tenant without a TenantsLost naming it
// before, and every tenant TenantsLost names is named by a TenantsRestored
// later, unless the bus is closed first.
type TenantLossHandler interface {
	LossHandler
	// TenantsLost says the subscriptions of these tenants cannot be trusted
	// any more. The slice is the handler's to keep.
	TenantsLost(tenants []string, err error)
	// TenantsRestored says these tenants' subscriptions work again; a
	// Resync of each follows (see above). The slice is the handler's to
	// keep.
	TenantsRestored(tenants []string)
}

// Bus is a node's subscription to the notifications of the tenants its
// connections watch.
type Bus interface {
	// Start begins delivering to h. It is called once, before Subscribe.
	Start(h Handler)
	// Subscribe takes a reference on tenant's notifications and returns once
	// the subscription is confirmed, so a change published after Subscribe
	// returns is delivered. release drops the reference; the last release
	// unsubscribes after a short linger. release is idempotent.
	Subscribe(ctx context.Context, tenantID string) (release func(), err error)
	// Close stops delivery and waits for the bus's goroutines. It is idempotent.
	Close() error
}

// Publisher writes a snapshot and announces it: the write path of the Task
// State Service and of POST /v1/publish.
type Publisher interface {
	// Publish stores s if it is newer than the stored version and, if it
	// was, announces it. written is false for a stale snapshot. A task
	// stored as another tenant's fails with snapshot.ErrTenantMismatch, and
	// on Redis a stored document whose version cannot be read with
	// snapshot.ErrStoredUnreadable; neither is stored or announced.
	Publish(ctx context.Context, s *snapshot.Snapshot) (written bool, err error)
}
