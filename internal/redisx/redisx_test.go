package redisx

import (
	"context"
	"errors"
	"net"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pushd/pushd/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// waitFor bounds every call that waits on Redis: a deadline against a hang,
// not a claim about speed.
const waitFor = 15 * time.Second

// dialLog is a dialer over real TCP that keeps every connection it made, so
// a test sees when go-redis dials and when it closes a connection.
type dialLog struct {
	addr string

	mu    sync.Mutex
	calls int // every call, successful or not
	conns []*loggedConn
}

type loggedConn struct {
	net.Conn
	once   sync.Once
	closed chan struct{}
}

func (c *loggedConn) Close() error {
	c.once.Do(func() { close(c.closed) })
	return c.Conn.Close()
}

func (d *dialLog) dial(ctx context.Context, network, _ string) (net.Conn, error) {
	d.mu.Lock()
	d.calls++
	d.mu.Unlock()
	var nd net.Dialer
	nc, err := nd.DialContext(ctx, network, d.addr)
	if err != nil {
		return nil, err
	}
	c := &loggedConn{Conn: nc, closed: make(chan struct{})}
	d.mu.Lock()
	d.conns = append(d.conns, c)
	d.mu.Unlock()
	return c, nil
}

// dialed returns the connections made so far and the dialer's calls.
func (d *dialLog) dialed() ([]*loggedConn, int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]*loggedConn(nil), d.conns...), d.calls
}

func isClosed(c *loggedConn) bool {
	select {
	case <-c.closed:
		return true
	default:
		return false
	}
}

// clientVia returns a client of r's Redis that dials through dialer.
func clientVia(t *testing.T, r testenv.Redis, dialer Dialer) *redis.Client {
	t.Helper()
	o := *r.Client.Options()
	o.Dialer = dialer
	c := redis.NewClient(&o)
	t.Cleanup(func() { c.Close() })
	return c
}

// receive returns ps's next message, or fails the test.
func receive(t *testing.T, ps *redis.PubSub) any {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	msg, err := ps.Receive(ctx)
	if err != nil {
		t.Fatalf("receive: %v", err)
	}
	return msg
}

// wantSubscribed fails the test unless msg confirms a SUBSCRIBE of channel.
func wantSubscribed(t *testing.T, msg any, channel string) {
	t.Helper()
	if s, ok := msg.(*redis.Subscription); !ok || s.Kind != "subscribe" || s.Channel != channel {
		t.Fatalf("got %#v, want the subscribe confirmation of %s", msg, channel)
	}
}

// TestForceReconnectRedialsAndResubscribes: ForceReconnect closes the
// Pub/Sub connection before it returns, without dialing, and the next
// receive dials a new connection, on which go-redis subscribes the channel
// again and messages arrive.
func TestForceReconnectRedialsAndResubscribes(t *testing.T) {
	r := testenv.SharedRedis(t)
	d := &dialLog{addr: r.Client.Options().Addr}
	c := clientVia(t, r, d.dial)
	ctx := context.Background()
	channel := r.Names.Prefix + "force"
	ps := c.Subscribe(ctx, channel)
	defer ps.Close()
	wantSubscribed(t, receive(t, ps), channel)
	conns, _ := d.dialed()
	if len(conns) != 1 {
		t.Fatalf("%d connections after the first subscribe, want 1", len(conns))
	}

	ForceReconnect(ps)
	if !isClosed(conns[0]) {
		t.Fatal("the Pub/Sub connection is still open after ForceReconnect")
	}
	if conns, _ := d.dialed(); len(conns) != 1 {
		t.Fatalf("ForceReconnect made a connection: %d in all, want 1", len(conns))
	}

	wantSubscribed(t, receive(t, ps), channel) // on a new connection
	conns, _ = d.dialed()
	if len(conns) != 2 || isClosed(conns[1]) {
		t.Fatalf("%d connections after the redial (the last closed: %v), want 2, the second open", len(conns), isClosed(conns[len(conns)-1]))
	}
	if n, err := r.Client.Publish(ctx, channel, "after").Result(); err != nil || n != 1 {
		t.Fatalf("publish after the redial reached %d subscribers (%v), want 1", n, err)
	}
	if m, ok := receive(t, ps).(*redis.Message); !ok || m.Channel != channel || m.Payload != "after" {
		t.Fatalf("got %#v, want the message published after the redial", m)
	}
}

// TestForceReconnectWithoutConnectionDialsNothing: on a PubSub that has no
// connection yet, ForceReconnect makes none (its dial fails on the expired
// context), and the next subscribe dials as usual.
func TestForceReconnectWithoutConnectionDialsNothing(t *testing.T) {
	r := testenv.SharedRedis(t)
	d := &dialLog{addr: r.Client.Options().Addr}
	c := clientVia(t, r, d.dial)
	ctx := context.Background()
	ps := c.Subscribe(ctx) // no channel: no connection
	defer ps.Close()

	ForceReconnect(ps)
	if conns, _ := d.dialed(); len(conns) != 0 {
		t.Fatalf("ForceReconnect without a connection made %d", len(conns))
	}
	channel := r.Names.Prefix + "later"
	if err := ps.Subscribe(ctx, channel); err != nil {
		t.Fatal(err)
	}
	wantSubscribed(t, receive(t, ps), channel)
	if conns, _ := d.dialed(); len(conns) != 1 {
		t.Fatalf("%d connections after the subscribe, want 1", len(conns))
	}
}

// TestDialOnceNeverRedials: a PubSub on a client dialing through DialOnce
// reports the loss of its connection and then ErrRedial, and never dials
// again.
func TestDialOnceNeverRedials(t *testing.T) {
	r := testenv.SharedRedis(t)
	d := &dialLog{addr: r.Client.Options().Addr}
	c := clientVia(t, r, DialOnce(d.dial))
	ctx := context.Background()
	channel := r.Names.Prefix + "once"
	ps := c.Subscribe(ctx, channel)
	defer ps.Close()
	wantSubscribed(t, receive(t, ps), channel)
	conns, calls := d.dialed()
	if len(conns) != 1 || calls != 1 {
		t.Fatalf("%d connections in %d dials, want 1 in 1", len(conns), calls)
	}

	conns[0].Conn.Close() // the connection fails under go-redis
	rctx, cancel := context.WithTimeout(ctx, waitFor)
	defer cancel()
	if _, err := ps.Receive(rctx); err == nil {
		t.Fatal("receive on a closed connection succeeded")
	}
	for range 3 {
		if _, err := ps.Receive(rctx); !errors.Is(err, ErrRedial) {
			t.Fatalf("receive after the loss: %v, want ErrRedial", err)
		}
	}
	if err := ps.Ping(rctx); !errors.Is(err, ErrRedial) {
		t.Fatalf("ping after the loss: %v, want ErrRedial", err)
	}
	if _, calls := d.dialed(); calls != 1 {
		t.Fatalf("dialed %d times, want once", calls)
	}
}

// TestReceiveTimeoutKeepsTheConnection: a receive that times out on a quiet
// subscription is IsTimeout, not IsReply, and go-redis keeps the connection:
// a ping on it is answered without a redial.
func TestReceiveTimeoutKeepsTheConnection(t *testing.T) {
	r := testenv.SharedRedis(t)
	d := &dialLog{addr: r.Client.Options().Addr}
	c := clientVia(t, r, d.dial)
	ctx := context.Background()
	channel := r.Names.Prefix + "quiet"
	ps := c.Subscribe(ctx, channel)
	defer ps.Close()
	wantSubscribed(t, receive(t, ps), channel)

	_, err := ps.ReceiveTimeout(ctx, time.Millisecond) // nothing is published
	if !IsTimeout(err) || IsReply(err) {
		t.Fatalf("quiet receive: %v: IsTimeout %v, IsReply %v; want a timeout", err, IsTimeout(err), IsReply(err))
	}
	if err := ps.Ping(ctx); err != nil {
		t.Fatal(err)
	}
	if _, ok := receive(t, ps).(*redis.Pong); !ok {
		t.Fatal("the ping after the timeout got no pong")
	}
	if conns, _ := d.dialed(); len(conns) != 1 || isClosed(conns[0]) {
		t.Fatalf("%d connections after the timeout, want the first, open", len(conns))
	}
}

// TestClassifiersKnowRealReplies produces each error for real and checks
// that its classifier, and only it, recognises it.
func TestClassifiersKnowRealReplies(t *testing.T) {
	r := testenv.SharedRedis(t)
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()

	// As stream's tailer meets it: XINFO STREAM of a missing key, in a
	// pipeline.
	pipe := r.Client.Pipeline()
	info := pipe.XInfoStream(ctx, r.Names.Prefix+"missing")
	pipe.Exec(ctx)
	noKey := info.Err()

	// As the scripts of snapshot and admission meet it: EVALSHA of a script
	// Redis never saw, in a pipeline.
	pipe = r.Client.Pipeline()
	sha := pipe.EvalSha(ctx, "0000000000000000000000000000000000000000", []string{r.Names.Prefix + "k"})
	pipe.Exec(ctx)
	noScript := sha.Err()

	// A failed connection: a port nobody listens on.
	down := redis.NewClient(&redis.Options{Addr: "127.0.0.1:" + strconv.Itoa(testenv.FreePort(t)), DialerRetries: 1, MaxRetries: -1})
	defer down.Close()
	refused := down.Ping(ctx).Err()

	// A context that ended.
	gone, stop := context.WithCancel(ctx)
	stop()
	canceled := r.Client.Get(gone, r.Names.Prefix+"k").Err()

	for _, tc := range []struct {
		name                   string
		err                    error
		reply, noKey, noScript bool
	}{
		{"xinfo of a missing key", noKey, true, true, false},
		{"evalsha of an unknown script", noScript, true, false, true},
		{"connection refused", refused, false, false, false},
		{"canceled context", canceled, false, false, false},
	} {
		if tc.err == nil {
			t.Errorf("%s: no error", tc.name)
			continue
		}
		if got := IsReply(tc.err); got != tc.reply {
			t.Errorf("%s (%v): IsReply %v, want %v", tc.name, tc.err, got, tc.reply)
		}
		if got := IsNoSuchKey(tc.err); got != tc.noKey {
			t.Errorf("%s (%v): IsNoSuchKey %v, want %v", tc.name, tc.err, got, tc.noKey)
		}
		if got := IsNoScript(tc.err); got != tc.noScript {
			t.Errorf("%s (%v): IsNoScript %v, want %v", tc.name, tc.err, got, tc.noScript)
		}
		if IsMoved(tc.err) || IsTimeout(tc.err) {
			t.Errorf("%s (%v): IsMoved %v, IsTimeout %v, want neither", tc.name, tc.err, IsMoved(tc.err), IsTimeout(tc.err))
		}
	}
}

// TestFailedWritesAndTheRedial pins what the Redis bus assumes of a failed
// SUBSCRIBE and UNSUBSCRIBE: a write that fails closes the connection; the
// channel of a failed SUBSCRIBE is kept and subscribed on the redial, while
// the channel of a failed UNSUBSCRIBE is forgotten and is not.
func TestFailedWritesAndTheRedial(t *testing.T) {
	r := testenv.SharedRedis(t)
	d := &dialLog{addr: r.Client.Options().Addr}
	c := clientVia(t, r, d.dial)
	ctx := context.Background()
	kept, dropped := r.Names.Prefix+"kept", r.Names.Prefix+"dropped"
	ps := c.Subscribe(ctx, dropped)
	defer ps.Close()
	wantSubscribed(t, receive(t, ps), dropped)

	expired, cancel := context.WithDeadline(ctx, time.Unix(1, 0))
	defer cancel()
	if err := ps.Subscribe(expired, kept); err == nil {
		t.Fatal("subscribe with an expired deadline succeeded")
	}
	conns, _ := d.dialed()
	if !isClosed(conns[0]) {
		t.Fatal("the connection a write failed on is still open")
	}
	if err := ps.Unsubscribe(expired, dropped); err == nil {
		t.Fatal("unsubscribe with an expired deadline succeeded")
	}

	msg := receive(t, ps) // redials
	wantSubscribed(t, msg, kept)
	if n := msg.(*redis.Subscription).Count; n != 1 {
		t.Fatalf("the redial subscribed %d channels, want only %s", n, kept)
	}
	if n, err := r.Client.Publish(ctx, dropped, "x").Result(); err != nil || n != 0 {
		t.Fatalf("publish on the unsubscribed channel reached %d subscribers (%v), want 0", n, err)
	}
	if conns, _ := d.dialed(); len(conns) != 2 {
		t.Fatalf("%d connections, want 2", len(conns))
	}
}
