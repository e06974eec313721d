package fanout

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pushd/pushd/internal/testenv"
	"github.com/pushd/pushd/keys"
	"github.com/pushd/pushd/snapshot"
)

// newBus starts a RedisBus on client, closed when the test ends.
func newBus(t *testing.T, client redis.UniversalClient, names keys.Names, cfg BusConfig) (*RedisBus, *recorder) {
	t.Helper()
	cfg.Client, cfg.Names = client, names
	b := NewRedisBus(cfg)
	r := newRecorder(t)
	b.Start(r)
	t.Cleanup(func() { closeBus(t, b) })
	return b, r
}

// unsubscribed hooks b's linger expiry into a channel. Call before Start's
// first Subscribe.
func unsubscribed(b *RedisBus) <-chan string {
	ch := make(chan string, 64)
	b.afterUnsubscribe = func(tenant string) { ch <- tenant }
	return ch
}

func publish(t *testing.T, c redis.UniversalClient, channel, payload string) int64 {
	t.Helper()
	n, err := c.Publish(testContext(t), channel, payload).Result()
	if err != nil {
		t.Fatalf("publish %s: %v", channel, err)
	}
	return n
}

func numSub(t *testing.T, c redis.UniversalClient, channel string) int64 {
	t.Helper()
	m, err := c.PubSubNumSub(testContext(t), channel).Result()
	if err != nil {
		t.Fatalf("pubsub numsub: %v", err)
	}
	return m[channel]
}

func note(task string, version int64) string {
	return fmt.Sprintf(`{"task_id":%q,"version":%d}`, task, version)
}

func TestRedisBusDeliversPlainPublish(t *testing.T) {
	rd := testenv.SharedRedis(t)
	b, r := newBus(t, rd.Client, rd.Names, BusConfig{})
	tenant := testenv.UniqueID("tenant")
	mustSubscribe(t, b, tenant)

	publish(t, rd.Client, rd.Names.Channel(tenant),
		`{"task_id":"task_1","version":18,"project_id":"p1","user_id":"u1","status":"RUNNING","occurred_at":1710000000000,"extra":true}`)
	got := next(t, r.notes, "notification")
	want := snapshot.Notification{TenantID: tenant, TaskID: "task_1", Version: 18, ProjectID: "p1", UserID: "u1",
		Status: "RUNNING", OccurredAt: 1710000000000}
	if got != want {
		t.Fatalf("got %+v, want %+v", got, want)
	}
	if s := b.Stats(); s.Received != 1 || s.Malformed != 0 || s.Subscribes != 1 {
		t.Fatalf("stats %+v", s)
	}
	if got := b.Subscribed(); len(got) != 1 || got[0] != tenant {
		t.Fatalf("Subscribed() = %v", got)
	}
}

// Subscribe returns only once Redis confirmed the subscription: a PUBLISH
// right after it reaches the bus, for every fresh tenant. The bus talks to
// Redis through a proxy that delays its traffic, so a Subscribe that
// returned once SUBSCRIBE was written, rather than confirmed, would lose the
// race to the direct PUBLISH.
func TestRedisBusSubscribeWaitsForConfirmation(t *testing.T) {
	rd := testenv.SharedRedis(t)
	proxy := startLatencyProxy(t, rd.Client.Options().Addr, 20*time.Millisecond)
	opt := *rd.Client.Options()
	opt.Addr = proxy.Addr
	slow := redis.NewClient(&opt)
	t.Cleanup(func() { slow.Close() })
	b, r := newBus(t, slow, rd.Names, BusConfig{})
	for i := range 50 {
		tenant := testenv.UniqueID(fmt.Sprintf("t%d", i))
		release := mustSubscribe(t, b, tenant)
		if n := publish(t, rd.Client, rd.Names.Channel(tenant), note("task", int64(i+1))); n != 1 {
			t.Fatalf("tenant %d: PUBLISH reached %d subscribers, want 1", i, n)
		}
		got := next(t, r.notes, "notification")
		if got.TenantID != tenant || got.Version != int64(i+1) {
			t.Fatalf("tenant %d: got %+v", i, got)
		}
		release()
	}
}

func TestRedisBusRefcountAndLinger(t *testing.T) {
	rd := testenv.SharedRedis(t)
	b := NewRedisBus(BusConfig{Client: rd.Client, Names: rd.Names, Linger: 20 * time.Millisecond})
	gone := unsubscribed(b)
	r := newRecorder(t)
	b.Start(r)
	t.Cleanup(func() { closeBus(t, b) })

	tenant := testenv.UniqueID("tenant")
	channel := rd.Names.Channel(tenant)
	releaseA := mustSubscribe(t, b, tenant)
	releaseB := mustSubscribe(t, b, tenant)
	if s := b.Stats(); s.Subscribes != 1 {
		t.Fatalf("two references sent %d SUBSCRIBEs, want 1", s.Subscribes)
	}
	if n := numSub(t, rd.Client, channel); n != 1 {
		t.Fatalf("NUMSUB = %d, want 1", n)
	}

	releaseA()
	releaseA() // idempotent: B's reference stays
	publish(t, rd.Client, channel, note("task", 1))
	if got := next(t, r.notes, "notification"); got.TenantID != tenant {
		t.Fatalf("got %+v", got)
	}
	none(t, gone, "unsubscribe with a reference left")

	releaseB()
	if got := next(t, gone, "unsubscribe after linger"); got != tenant {
		t.Fatalf("unsubscribed %q, want %q", got, tenant)
	}
	if n := numSub(t, rd.Client, channel); n != 0 {
		t.Fatalf("NUMSUB after linger = %d, want 0", n)
	}
	if got := b.Subscribed(); len(got) != 0 {
		t.Fatalf("Subscribed() = %v, want none", got)
	}
	if s := b.Stats(); s.Unsubscribes != 1 {
		t.Fatalf("Unsubscribes = %d, want 1", s.Unsubscribes)
	}

	// A tenant that went away subscribes afresh.
	mustSubscribe(t, b, tenant)
	if s := b.Stats(); s.Subscribes != 2 {
		t.Fatalf("Subscribes = %d, want 2", s.Subscribes)
	}
	if n := publish(t, rd.Client, channel, note("task", 2)); n != 1 {
		t.Fatalf("PUBLISH reached %d subscribers, want 1", n)
	}
	next(t, r.notes, "notification")
}

// A Subscribe while the tenant lingers revives it: no new SUBSCRIBE.
func TestRedisBusReviveDuringLinger(t *testing.T) {
	rd := testenv.SharedRedis(t)
	b, r := newBus(t, rd.Client, rd.Names, BusConfig{Linger: time.Hour})
	tenant := testenv.UniqueID("tenant")
	release := mustSubscribe(t, b, tenant)
	release()
	if got := b.Subscribed(); len(got) != 1 {
		t.Fatalf("lingering tenant missing from Subscribed(): %v", got)
	}
	release = mustSubscribe(t, b, tenant)
	defer release()
	if s := b.Stats(); s.Subscribes != 1 || s.Unsubscribes != 0 {
		t.Fatalf("revive resubscribed: %+v", s)
	}
	b.mu.Lock()
	e := b.subs[tenant]
	refs, timer := e.refs, e.timer
	b.mu.Unlock()
	if refs != 1 || timer != nil {
		t.Fatalf("after revive refs = %d, timer armed = %v", refs, timer != nil)
	}
	publish(t, rd.Client, rd.Names.Channel(tenant), note("task", 1))
	next(t, r.notes, "notification")
	none(t, r.resyncs, "resync")
}

func TestRedisBusMalformed(t *testing.T) {
	rd := testenv.SharedRedis(t)
	b, r := newBus(t, rd.Client, rd.Names, BusConfig{})
	ctx := testContext(t)

	// Channels no tenant subscription can produce, subscribed behind the
	// bus's back on its connection. They are written before the tenant's
	// SUBSCRIBE, so they are live once Subscribe returns.
	badTenant := rd.Names.Prefix + "task.changed.{bad tenant}"
	badShape := rd.Names.Prefix + "task.changed.nobraces"
	if err := b.ps.Subscribe(ctx, badTenant, badShape); err != nil {
		t.Fatal(err)
	}
	tenant := testenv.UniqueID("tenant")
	mustSubscribe(t, b, tenant)
	channel := rd.Names.Channel(tenant)

	garbage := []struct{ channel, payload, reason string }{
		{channel, "not json", reasonJSON},
		{channel, `["task_id","version"]`, reasonJSON},
		{channel, `{"task_id":"t1","version":"2"}`, reasonJSON},
		{channel, `{"task_id":"t1","version":2.5}`, reasonJSON},
		{channel, `{"task_id":"t1","task_id":"t2","version":2}`, reasonJSON}, // no reader may pick the other one
		{channel, `{"TASK_ID":"t1","version":2}`, reasonTaskID},              // names match exactly
		{channel, `{"version":2}`, reasonTaskID},
		{channel, `{"task_id":"has space","version":2}`, reasonTaskID},
		{channel, `{"task_id":"t1"}`, reasonVersion},
		{channel, `{"task_id":"t1","version":-3}`, reasonVersion},
		{channel, `{"task_id":"t1","version":2,"project_id":"p{1}"}`, reasonProjectID},
		{channel, `{"task_id":"t1","version":2,"user_id":"` + strings.Repeat("u", snapshot.MaxIDLen+1) + `"}`, reasonUserID},
		{channel, `{"task_id":"t1","version":2,"pad":"` + strings.Repeat("x", MaxNotificationSize) + `"}`, reasonSize},
		{badTenant, note("t1", 2), reasonChannel},
		{badShape, note("t1", 2), reasonChannel},
	}
	want := map[string]int64{}
	for _, g := range garbage {
		publish(t, rd.Client, g.channel, g.payload)
		want[g.reason]++
	}
	// Messages of one publishing connection reach the subscriber in order:
	// once the good one arrives, every bad one was read.
	publish(t, rd.Client, channel, note("t2", 7))
	if got := next(t, r.notes, "notification"); got.TaskID != "t2" || got.Version != 7 || got.TenantID != tenant {
		t.Fatalf("got %+v", got)
	}
	s := b.Stats()
	if s.Malformed != int64(len(garbage)) || s.Received != int64(len(garbage))+1 {
		t.Fatalf("Malformed = %d, Received = %d, want %d, %d", s.Malformed, s.Received, len(garbage), len(garbage)+1)
	}
	for _, reason := range malformedReasons {
		if s.MalformedBy[reason] != want[reason] {
			t.Errorf("MalformedBy[%s] = %d, want %d", reason, s.MalformedBy[reason], want[reason])
		}
	}
	none(t, r.notes, "notification")
}

func TestRedisBusSubscribeErrors(t *testing.T) {
	rd := testenv.SharedRedis(t)
	b := NewRedisBus(BusConfig{Client: rd.Client, Names: rd.Names})
	if _, err := b.Subscribe(testContext(t), "t1"); err == nil {
		t.Fatal("Subscribe before Start succeeded")
	}
	b.Start(newRecorder(t))
	t.Cleanup(func() { closeBus(t, b) })
	for _, bad := range []string{"", "a b", "t{1}", strings.Repeat("t", snapshot.MaxIDLen+1)} {
		if _, err := b.Subscribe(testContext(t), bad); !errors.Is(err, snapshot.ErrInvalidID) {
			t.Errorf("Subscribe(%q) = %v, want ErrInvalidID", bad, err)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := b.Subscribe(ctx, "t1"); !errors.Is(err, context.Canceled) {
		t.Errorf("Subscribe with a cancelled context = %v", err)
	}
	if got := b.Subscribed(); len(got) != 0 {
		t.Errorf("Subscribed() = %v, want none", got)
	}
}

// Many tenants share the node's one Pub/Sub connection. A private server
// makes CLIENT LIST exact.
func TestRedisBusOneConnection(t *testing.T) {
	srv := testenv.StartRedis(t)
	client := srv.Client()
	b, r := newBus(t, client, keys.Names{}, BusConfig{})

	const tenants = 200
	var wg sync.WaitGroup
	errs := make(chan error, tenants)
	for i := range tenants {
		wg.Go(func() {
			if _, err := b.Subscribe(testContext(t), fmt.Sprintf("tenant-%d", i)); err != nil {
				errs <- err
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}

	list, err := client.Do(testContext(t), "CLIENT", "LIST", "TYPE", "pubsub").Text()
	if err != nil {
		t.Fatal(err)
	}
	if lines := strings.Split(strings.TrimSpace(list), "\n"); len(lines) != 1 {
		t.Fatalf("%d Pub/Sub connections, want 1:\n%s", len(lines), list)
	}
	channels, err := client.PubSubChannels(testContext(t), "*").Result()
	if err != nil {
		t.Fatal(err)
	}
	// Every tenant's channel, and the bus's liveness channel.
	if len(channels) != tenants+1 || !slices.Contains(channels, b.liveChannel) || len(b.Subscribed()) != tenants {
		t.Fatalf("%d channels on the server, %d tenants on the bus, want %d and the liveness channel", len(channels), len(b.Subscribed()), tenants)
	}
	if s := b.Stats(); s.Subscribes != tenants {
		t.Fatalf("Subscribes = %d, want %d", s.Subscribes, tenants)
	}
	for _, i := range []int{0, tenants / 2, tenants - 1} {
		tenant := fmt.Sprintf("tenant-%d", i)
		if n := publish(t, client, keys.Names{}.Channel(tenant), note("task", 1)); n != 1 {
			t.Fatalf("PUBLISH to %s reached %d subscribers, want 1", tenant, n)
		}
		if got := next(t, r.notes, "notification"); got.TenantID != tenant {
			t.Fatalf("got %+v", got)
		}
	}
}

// A killed and restarted Redis: the bus reports the loss, go-redis
// resubscribes, the bus calls Resync for every tenant, and notifications
// flow again.
func TestRedisBusResyncAfterRestart(t *testing.T) {
	srv := testenv.StartRedis(t)
	client := srv.Client()
	b, r := newBus(t, client, keys.Names{}, BusConfig{PingInterval: 200 * time.Millisecond})
	tenants := []string{"t1", "t2", "t3"}
	for _, tenant := range tenants {
		mustSubscribe(t, b, tenant)
	}
	publish(t, client, keys.Names{}.Channel("t1"), note("task", 1))
	next(t, r.notes, "notification before the restart")

	srv.Stop()
	next(t, r.lost, "loss")
	srv.Start()

	resynced := map[string]bool{}
	for range tenants {
		resynced[next(t, r.resyncs, "resync")] = true
	}
	for _, tenant := range tenants {
		if !resynced[tenant] {
			t.Fatalf("no resync of %s: %v", tenant, resynced)
		}
	}
	// In order: Lost, Restored, then each tenant's Resync.
	expectOutage(t, r, tenants...)
	next(t, r.restored, "restore")
	for _, tenant := range tenants {
		if n := publish(t, client, keys.Names{}.Channel(tenant), note("task", 2)); n != 1 {
			t.Fatalf("PUBLISH after the restart reached %d subscribers, want 1", n)
		}
		if got := next(t, r.notes, "notification after the restart"); got.TenantID != tenant || got.Version != 2 {
			t.Fatalf("got %+v", got)
		}
	}
	mustSubscribe(t, b, "t4")
	if n := publish(t, client, keys.Names{}.Channel("t4"), note("task", 3)); n != 1 {
		t.Fatalf("PUBLISH to a tenant subscribed after the restart reached %d subscribers, want 1", n)
	}
	next(t, r.notes, "notification of a new tenant")
	if s := b.Stats(); s.Resyncs != int64(len(tenants)) || s.Failures == 0 {
		t.Fatalf("stats %+v", s)
	}
	none(t, r.resyncs, "resync")
	none(t, r.events, "event")
}

// A connection that goes silent (Redis paused, so a ping stays unanswered)
// is replaced without waiting for TCP to notice. A Subscribe waiting for a
// confirmation meanwhile gives up with its context; the tenant is
// unsubscribed after its confirmation arrives and its linger ends.
func TestRedisBusSilentConnection(t *testing.T) {
	srv := testenv.StartRedis(t)
	client := srv.Client()
	b := NewRedisBus(BusConfig{Client: client, PingInterval: 100 * time.Millisecond, Linger: 10 * time.Millisecond})
	gone := unsubscribed(b)
	r := newRecorder(t)
	b.Start(r)
	t.Cleanup(func() { closeBus(t, b) })
	mustSubscribe(t, b, "t1")

	if err := client.Do(testContext(t), "CLIENT", "PAUSE", 1500, "ALL").Err(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, err := b.Subscribe(ctx, "t2"); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Subscribe while paused = %v, want DeadlineExceeded", err)
	}
	if err := next(t, r.lost, "loss"); !errors.Is(err, errNoPong) {
		t.Fatalf("lost: %v, want errNoPong", err)
	}
	if got := next(t, r.resyncs, "resync"); got != "t1" {
		t.Fatalf("resync of %q, want t1", got)
	}
	if got := next(t, gone, "unsubscribe of the abandoned tenant"); got != "t2" {
		t.Fatalf("unsubscribed %q, want t2", got)
	}
	if n := publish(t, client, keys.Names{}.Channel("t1"), note("task", 1)); n != 1 {
		t.Fatalf("PUBLISH reached %d subscribers, want 1", n)
	}
	next(t, r.notes, "notification after the pause")
	if got := b.Subscribed(); len(got) != 1 || got[0] != "t1" {
		t.Fatalf("Subscribed() = %v, want [t1]", got)
	}
}

func TestRedisBusClose(t *testing.T) {
	rd := testenv.SharedRedis(t)
	b := NewRedisBus(BusConfig{Client: rd.Client, Names: rd.Names})
	b.Start(newRecorder(t))
	mustSubscribe(t, b, testenv.UniqueID("tenant"))
	for range 2 {
		if err := b.Close(); err != nil {
			t.Fatalf("close: %v", err)
		}
	}
	if _, err := b.Subscribe(testContext(t), "t1"); !errors.Is(err, ErrClosed) {
		t.Fatalf("Subscribe after Close = %v, want ErrClosed", err)
	}

	// Closed before Start, and started after Close: no goroutine either way.
	b = NewRedisBus(BusConfig{Client: rd.Client, Names: rd.Names})
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	b.Start(newRecorder(t))
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
}
