// Package redisx owns the go-redis behaviours pushd relies on beyond its
// documented commands: how a Pub/Sub connection is made to reconnect, how a
// client is kept from redialing, how Redis's error replies are told apart,
// and how a cluster's seed nodes are parsed. Each helper says which go-redis
// behaviour it uses; the package's tests run them against real Redis and
// fail if a go-redis upgrade changes one.
package redisx

import (
	"context"
	"errors"
	"net"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// ForceReconnect closes ps's connection, if it has one, so that its next
// receive dials a new one and subscribes every channel ps holds again. It
// never waits on Redis: nothing reaches the wire, and no connection is made.
//
// go-redis has no call for this. It relies on three behaviours of PubSub:
// a write uses the context's deadline as the socket's write deadline (unless
// the client's WriteTimeout is -2, which disables deadlines); a failed write
// closes the connection; and the redial go-redis then tries at once, with the
// same expired context, fails at once because the dialer honours the
// context. Without a connection, the ping's dial fails the same way.
func ForceReconnect(ps *redis.PubSub) {
	ctx, cancel := context.WithDeadline(context.Background(), time.Unix(1, 0))
	defer cancel()
	_ = ps.Ping(ctx) // fails by design
}

// ErrRedial is what a dialer made by DialOnce returns after its first dial.
var ErrRedial = errors.New("redisx: connection lost; not redialed")

// Dialer is the type of redis.Options.Dialer.
type Dialer = func(ctx context.Context, network, addr string) (net.Conn, error)

// DialOnce returns a dialer that dials once, through dial, and returns
// ErrRedial on every later call, whether the first succeeded or not.
//
// It is for a client whose PubSub must not reconnect by itself: go-redis
// redials a PubSub's lost connection on its next command or receive, through
// Options.Dialer, and sends one SUBSCRIBE, PSUBSCRIBE and SSUBSCRIBE for
// every channel it held, which Redis Cluster refuses with CROSSSLOT when the
// shard channels span slots. A PubSub's dial goes straight to the dialer,
// without the pool's retries, so the error the receive returns is this
// dialer's own.
func DialOnce(dial Dialer) Dialer {
	var dialed atomic.Bool
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		if dialed.Swap(true) {
			return nil, ErrRedial
		}
		return dial(ctx, network, addr)
	}
}
