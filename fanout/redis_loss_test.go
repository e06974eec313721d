package fanout

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pushd/pushd/internal/testenv"
	"github.com/pushd/pushd/keys"
)

// newLiveBus is newBus with the liveness hooks set before Start: heard gets a
// value per liveness message the loop heard, pubErrs one per liveness
// PUBLISH that failed.
func newLiveBus(t *testing.T, client redis.UniversalClient, names keys.Names, cfg BusConfig) (b *RedisBus, r *recorder, heard <-chan struct{}, pubErrs <-chan error) {
	t.Helper()
	cfg.Client, cfg.Names = client, names
	b = NewRedisBus(cfg)
	h := make(chan struct{}, 4096)
	e := make(chan error, 4096)
	b.afterLivenessHeard = func() {
		select {
		case h <- struct{}{}:
		default:
		}
	}
	b.afterLivenessPublish = func(err error) {
		if err == nil {
			return
		}
		select {
		case e <- err:
		default:
		}
	}
	r = newRecorder(t)
	b.Start(r)
	t.Cleanup(func() { closeBus(t, b) })
	return b, r, h, e
}

// expectOutage reads one outage from r.events: Lost, then Restored, then a
// Resync of each of tenants, in any order among themselves.
func expectOutage(t *testing.T, r *recorder, tenants ...string) {
	t.Helper()
	if ev := next(t, r.events, "loss"); ev != "lost" {
		t.Fatalf("first event %q, want lost", ev)
	}
	if ev := next(t, r.events, "restore"); ev != "restored" {
		t.Fatalf("event after lost %q, want restored", ev)
	}
	want := map[string]bool{}
	for _, tenant := range tenants {
		want["resync:"+tenant] = true
	}
	for range tenants {
		ev := next(t, r.events, "resync")
		if !want[ev] {
			t.Fatalf("event after restored %q, want one of %v", ev, want)
		}
		delete(want, ev)
	}
}

// Redis down when the bus starts: the loop's first receive fails and Lost
// is reported, liveness PUBLISHes fail and are counted; once Redis is up,
// Restored follows, with no Resync (no tenant was ever confirmed, and the
// liveness channel's confirmation is not a tenant's), and tenants subscribe.
func TestRedisBusLostAtStart(t *testing.T) {
	srv := testenv.StartRedis(t)
	client := srv.Client()
	srv.Stop()
	b, r, _, pubErrs := newLiveBus(t, client, keys.Names{}, BusConfig{
		PingInterval:     200 * time.Millisecond,
		LivenessInterval: 50 * time.Millisecond,
		LivenessTimeout:  waitFor, // only the outage is under test
	})

	if err := next(t, r.lost, "loss at start"); err == nil {
		t.Fatal("Lost(nil)")
	}
	next(t, pubErrs, "failed liveness publish")
	none(t, r.restored, "restore while Redis is down")
	if s := b.Stats(); s.LivenessFailures == 0 || s.Failures == 0 {
		t.Fatalf("stats while down %+v", s)
	}

	srv.Start()
	next(t, r.restored, "restore")
	expectOutage(t, r)

	mustSubscribe(t, b, "t1")
	if n := publish(t, client, keys.Names{}.Channel("t1"), note("task", 1)); n != 1 {
		t.Fatalf("PUBLISH reached %d subscribers, want 1", n)
	}
	if got := next(t, r.notes, "notification"); got.TenantID != "t1" {
		t.Fatalf("got %+v", got)
	}
	none(t, r.events, "event after the restore")
	if s := b.Stats(); s.Resyncs != 0 {
		t.Fatalf("Resyncs = %d, want 0", s.Resyncs)
	}
}

// The bus hears its own liveness messages on its one Pub/Sub connection;
// they are neither notifications nor tenants.
func TestRedisBusLivenessHeard(t *testing.T) {
	rd := testenv.SharedRedis(t)
	b, r, heard, _ := newLiveBus(t, rd.Client, rd.Names, BusConfig{
		LivenessInterval: 20 * time.Millisecond,
		LivenessTimeout:  waitFor, // a slow test machine must not drop the connection
	})
	if !strings.HasPrefix(b.liveChannel, rd.Names.Prefix+"pushd.liveness.{") {
		t.Fatalf("liveness channel %q", b.liveChannel)
	}
	tenant := testenv.UniqueID("tenant")
	mustSubscribe(t, b, tenant)
	for range 3 {
		next(t, heard, "liveness message")
	}

	publish(t, rd.Client, rd.Names.Channel(tenant), note("task", 1))
	if got := next(t, r.notes, "notification"); got.TenantID != tenant || got.Version != 1 {
		t.Fatalf("got %+v", got)
	}
	s := b.Stats()
	// The third message heard was sent after the first two PUBLISHes
	// returned.
	if s.LivenessHeard < 3 || s.LivenessSent < 2 {
		t.Fatalf("LivenessHeard = %d, LivenessSent = %d", s.LivenessHeard, s.LivenessSent)
	}
	if s.Received != 1 || s.Malformed != 0 || s.Subscribes != 1 || s.Resyncs != 0 {
		t.Fatalf("liveness counted as a notification or a tenant: %+v", s)
	}
	none(t, r.notes, "notification")
	none(t, r.events, "event")
	if got := b.Subscribed(); !slices.Equal(got, []string{tenant}) {
		t.Fatalf("Subscribed() = %v, want [%s]", got, tenant)
	}
	if n := numSub(t, rd.Client, b.liveChannel); n != 1 {
		t.Fatalf("NUMSUB of the liveness channel = %d, want 1", n)
	}
}

func TestRedisBusLivenessDisabled(t *testing.T) {
	rd := testenv.SharedRedis(t)
	b, r := newBus(t, rd.Client, rd.Names, BusConfig{LivenessInterval: -1})
	if b.liveChannel != "" {
		t.Fatalf("liveness channel %q with the check disabled", b.liveChannel)
	}
	tenant := testenv.UniqueID("tenant")
	mustSubscribe(t, b, tenant)
	publish(t, rd.Client, rd.Names.Channel(tenant), note("task", 1))
	next(t, r.notes, "notification")
	closeBus(t, b)
	if s := b.Stats(); s.LivenessSent != 0 || s.LivenessFailures != 0 {
		t.Fatalf("stats %+v", s)
	}
}

// A half-open link: the proxy stalls the bus's Pub/Sub connection (no byte
// moves, no FIN, no RST), while new connections pass. Pings are too rare to
// notice; the liveness check does: Lost says liveness, the bus redials
// through the proxy, Restored and the tenant's Resync follow, and
// notifications flow again.
func TestRedisBusLivenessHalfOpen(t *testing.T) {
	srv := testenv.StartRedis(t)
	direct := srv.Client()
	proxy := testenv.StartProxy(t, srv.Addr)
	// A short ReadTimeout, so a liveness PUBLISH on a stalled pooled
	// connection gives up soon and the next one dials afresh.
	client := redis.NewClient(&redis.Options{Addr: proxy.Addr, ReadTimeout: 500 * time.Millisecond})
	t.Cleanup(func() { client.Close() })
	b, r, heard, _ := newLiveBus(t, client, keys.Names{}, BusConfig{
		PingInterval:     time.Minute,
		LivenessInterval: 100 * time.Millisecond,
		LivenessTimeout:  time.Second,
	})
	mustSubscribe(t, b, "t1")
	next(t, heard, "liveness message")
	publish(t, direct, keys.Names{}.Channel("t1"), note("task", 1))
	next(t, r.notes, "notification before the stall")
	none(t, r.events, "event before the stall")

	proxy.Stall()
	err := next(t, r.lost, "loss")
	if !errors.Is(err, errNoLiveness) || !strings.Contains(err.Error(), "liveness") {
		t.Fatalf("Lost(%v), want a liveness error", err)
	}
	expectOutage(t, r, "t1")

	// The stalled connection is still subscribed as far as Redis knows, so
	// PUBLISH counts it too.
	if n := publish(t, direct, keys.Names{}.Channel("t1"), note("task", 2)); n < 1 {
		t.Fatalf("PUBLISH after the redial reached %d subscribers", n)
	}
	if got := next(t, r.notes, "notification after the redial"); got.TenantID != "t1" || got.Version != 2 {
		t.Fatalf("got %+v", got)
	}
	if s := b.Stats(); s.Failures == 0 || s.Resyncs != 1 {
		t.Fatalf("stats %+v", s)
	}
	none(t, r.events, "event after the redial")
}
