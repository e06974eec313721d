package redisx

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pushd/pushd/internal/testenv"
)

// TestParseClusterURLKeepsOptions: the seeds' addresses, in order, and the
// first seed's credentials, TLS and go-redis options all reach the client's
// options; a bare seed takes the first one's scheme.
func TestParseClusterURLKeepsOptions(t *testing.T) {
	o, err := ParseClusterURL("rediss://u:pw@a:1/0?pool_size=7&dial_timeout=2s&read_timeout=3&write_timeout=4s&max_retries=-1&dialer_retries=2&addr=b:2, rediss://c:3?addr=d:4 ,,e")
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"a:1", "b:2", "c:3", "d:4", "e:6379"}; !slices.Equal(o.Addrs, want) {
		t.Errorf("Addrs %q, want %q", o.Addrs, want)
	}
	if o.Username != "u" || o.Password != "pw" {
		t.Errorf("user %q password %q, want u and pw", o.Username, o.Password)
	}
	if o.TLSConfig == nil || o.TLSConfig.ServerName != "a" {
		t.Errorf("TLS config %+v, want one for server a", o.TLSConfig)
	}
	if o.PoolSize != 7 || o.DialTimeout != 2*time.Second || o.ReadTimeout != 3*time.Second ||
		o.WriteTimeout != 4*time.Second || o.MaxRetries != -1 || o.DialerRetries != 2 {
		t.Errorf("pool %d, timeouts dial %v read %v write %v, retries %d, dialer retries %d; want 7, 2s 3s 4s, -1, 2",
			o.PoolSize, o.DialTimeout, o.ReadTimeout, o.WriteTimeout, o.MaxRetries, o.DialerRetries)
	}

	o, err = ParseClusterURL("h1:7000,redis://h2")
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"h1:7000", "h2:6379"}; !slices.Equal(o.Addrs, want) || o.TLSConfig != nil || o.Password != "" {
		t.Errorf("bare seeds: Addrs %q TLS %v password %q, want %q, no TLS, no password", o.Addrs, o.TLSConfig, o.Password, want)
	}
}

// TestParseClusterURLRefuses: bad seeds fail with their position and why,
// never repeating the password.
func TestParseClusterURLRefuses(t *testing.T) {
	for _, tc := range []struct{ urls, want string }{
		{" , ", "no seed node"},
		{"a:1,http://u:secret@b:2", "seed 2: redis: invalid URL scheme: http"},
		{"redis://u:secret@a:port", `seed 1: invalid port ":port" after host`},
		{"redis://a:1?pool_size=many", "seed 1: redis: invalid pool_size number"},
		{"redis://a:1?db=2", "seed 1: redis: unexpected option: db"},
		{"redis://a:1/3", `seed 1: database "3": a cluster has only database 0`},
		{"a:1,b:2?pool_size=3", `seed 2: option "pool_size": options go on the first seed`},
		{"rediss://a:1,redis://b:2", "seed 2: scheme redis:// where seed 1 has rediss://"},
		{"a:1,rediss://b:2", "seed 2: scheme rediss:// where seed 1 has redis://"},
	} {
		_, err := ParseClusterURL(tc.urls)
		if err == nil || !strings.HasPrefix(err.Error(), tc.want) {
			t.Errorf("%q: %v, want %s...", tc.urls, err, tc.want)
		}
		if err != nil && strings.Contains(err.Error(), "secret") {
			t.Errorf("%q: the error shows the password: %v", tc.urls, err)
		}
	}
}

// TestOnACluster: a client made from ParseClusterURL of a real cluster's
// seeds serves keys on every master, and a shard channel published straight
// to a master that does not own its slot is refused with a reply IsMoved
// recognises, as the cluster bus's liveness check expects.
func TestOnACluster(t *testing.T) {
	c := testenv.StartRedisCluster(t, 3)
	o, err := ParseClusterURL(c.Seeds)
	if err != nil {
		t.Fatal(err)
	}
	if want := strings.Split(c.Seeds, ","); !slices.Equal(o.Addrs, want) {
		t.Fatalf("Addrs %q from seeds %q, want %q", o.Addrs, c.Seeds, want)
	}
	cc := redis.NewClusterClient(o)
	defer cc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()

	masters := c.Masters()
	keys, _ := c.Spread(1, func(i int) string { return fmt.Sprintf("k%d", i) }, func(id string) string { return id })
	for _, k := range keys {
		if err := cc.Set(ctx, k, "v", 0).Err(); err != nil {
			t.Fatalf("set %s through the parsed options: %v", k, err)
		}
	}
	if len(keys) != len(masters) {
		t.Fatalf("%d keys spread over %d masters", len(keys), len(masters))
	}

	channel := keys[0]
	owner := c.MasterOf(channel)
	other := redis.NewClient(&redis.Options{Addr: c.OtherMaster(owner), MaxRetries: -1})
	defer other.Close()
	err = other.SPublish(ctx, channel, "x").Err()
	if !IsMoved(err) || !IsReply(err) {
		t.Fatalf("spublish to a master not owning the slot: %v: IsMoved %v, IsReply %v; want both", err, IsMoved(err), IsReply(err))
	}
	if IsNoSuchKey(err) || IsNoScript(err) || IsTimeout(err) {
		t.Errorf("MOVED (%v) taken for another error", err)
	}
}
