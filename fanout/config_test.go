package fanout

import (
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"
)

// mustPanic runs f and returns what it panicked with, failing if it did not.
func mustPanic(t *testing.T, what string, f func()) (v any) {
	t.Helper()
	defer func() {
		if v = recover(); v == nil {
			t.Fatalf("%s did not panic", what)
		}
	}()
	f()
	return nil
}

// Each constructor refuses a client it cannot use, saying which it needs;
// neither does I/O, so the clients need no server.
func TestBusConfigClientMisuse(t *testing.T) {
	plain := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	defer plain.Close()
	ring := redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": "127.0.0.1:1"}})
	defer ring.Close()
	for _, c := range []struct {
		what string
		f    func()
		want string
	}{
		{"NewClusterBus with a *redis.Client", func() { NewClusterBus(BusConfig{Client: plain}) }, "needs a *redis.ClusterClient as BusConfig.Client, not *redis.Client"},
		{"NewClusterBus without a client", func() { NewClusterBus(BusConfig{}) }, "needs a *redis.ClusterClient"},
		{"NewClusterBus with a nil *redis.ClusterClient", func() { NewClusterBus(BusConfig{Client: (*redis.ClusterClient)(nil)}) }, "needs a *redis.ClusterClient"},
		{"NewRedisBus with a *redis.Ring", func() { NewRedisBus(BusConfig{Client: ring}) }, "cannot use a *redis.Ring"},
		{"NewRedisBus without a client", func() { NewRedisBus(BusConfig{}) }, "BusConfig.Client is required"},
	} {
		if v := mustPanic(t, c.what, c.f); !strings.Contains(v.(string), c.want) {
			t.Errorf("%s panicked with %q, want it to say %q", c.what, v, c.want)
		}
	}

	// One configuration serves both buses: the cluster client a cluster
	// node passes to NewClusterBus is one NewRedisBus takes too.
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{"127.0.0.1:1"}})
	defer cc.Close()
	cfg := BusConfig{Client: cc}
	for _, b := range []Bus{NewClusterBus(cfg), NewRedisBus(cfg)} {
		closeBus(t, b)
	}
}
