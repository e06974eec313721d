package fanout

import (
	"fmt"
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pushd/pushd/internal/testenv"
)

// firstSlot reads the node's own line of CLUSTER NODES, whichever line it
// is, and skips the slots it is importing or migrating.
func TestFirstSlotOfClusterNodes(t *testing.T) {
	const other = "07c37dfeb235213a872192d90877d0cd55635b91 127.0.0.1:30004@31004,host-a slave e7d1eecce10fd6bb5eb35b9f99a514335d9ba9ca 0 1426238317239 4 connected\n"
	for _, c := range []struct {
		name, self string
		want       int
		ok         bool
	}{
		{"one range", "myself,master - 0 0 1 connected 5461-10922", 5461, true},
		{"ranges and a single slot", "myself,master - 0 0 1 connected 12000 100-200 9000-9100", 100, true},
		{"migrating and importing", "myself,master - 0 0 1 connected [0->-e7d1eecce10fd6bb5eb35b9f99a514335d9ba9ca] [7-<-e7d1eecce10fd6bb5eb35b9f99a514335d9ba9ca] 1-5460", 1, true},
		{"no slot", "myself,master - 0 0 1 connected", 0, false},
		{"only migrating", "myself,master - 0 0 1 connected [0->-e7d1eecce10fd6bb5eb35b9f99a514335d9ba9ca]", 0, false},
	} {
		nodes := other + "e7d1eecce10fd6bb5eb35b9f99a514335d9ba9ca 127.0.0.1:30001@31001 " + c.self + "\n" + other
		if got, ok := firstSlot(nodes); got != c.want || ok != c.ok {
			t.Errorf("%s: firstSlot = %d, %v; want %d, %v", c.name, got, ok, c.want, c.ok)
		}
	}
	if _, ok := firstSlot(other); ok {
		t.Error("firstSlot found a slot without a myself line")
	}
}

// liveChannels returns, by master address, the liveness channel of each of
// the bus's shards that named one.
func (b *ClusterBus) liveChannels() map[string]string {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := make(map[string]string, len(b.shards))
	for addr, sh := range b.shards {
		if sh.live != "" {
			out[addr] = sh.live
		}
	}
	return out
}

// waitLiveChannels waits until the bus has a shard on every master in
// want, each with the channel want gives it, and returns what it has.
func waitLiveChannels(t *testing.T, b *ClusterBus, want map[string]string) {
	t.Helper()
	testenv.Eventually(t, fmt.Sprintf("liveness channels %v", want), func() bool { return maps.Equal(b.liveChannels(), want) })
}

// firstSlots asks each master which slots it serves (CLUSTER SHARDS, the
// shard it is master of) and returns, by address, the first slot of its first range.
func firstSlots(t *testing.T, f *clusterFixture) map[string]int {
	t.Helper()
	ctx := testContext(t)
	out := map[string]int{}
	for _, m := range f.c.Masters() {
		cl := redis.NewClient(&redis.Options{Addr: m.Addr})
		id, err := cl.ClusterMyID(ctx).Result()
		if err != nil {
			t.Fatalf("CLUSTER MYID of %s: %v", m.Addr, err)
		}
		shards, err := cl.ClusterShards(ctx).Result()
		cl.Close()
		if err != nil {
			t.Fatalf("CLUSTER SHARDS of %s: %v", m.Addr, err)
		}
		first := -1
		for _, sh := range shards {
			if !slices.ContainsFunc(sh.Nodes, func(n redis.Node) bool { return n.ID == id && n.Role == "master" }) {
				continue
			}
			for _, r := range sh.Slots {
				if first < 0 || int(r.Start) < first {
					first = int(r.Start)
				}
			}
		}
		if first < 0 {
			t.Fatalf("%s serves no slot", m.Addr)
		}
		out[m.Addr] = first
	}
	return out
}

// Each shard's liveness channel is named after the first slot of its
// master's first range, which Redis puts it in (CLUSTER KEYSLOT) and the
// master serves; a second bus, another node, names the same channels; each
// bus hears back its own messages only, though every bus hears all of them;
// and the tag of every slot hashes to it by Redis's own reckoning.
func TestClusterBusLivenessChannelIsTheMastersFirstSlot(t *testing.T) {
	// A long timeout: the test is about names, not a slow machine's silences.
	cfg := BusConfig{LivenessInterval: 100 * time.Millisecond, LivenessTimeout: 10 * time.Second}
	f := newClusterFixtureWith(t, 1, cfg, nil)
	cfg.Client, cfg.Names = f.c.Client(), clusterNames
	other := NewClusterBus(cfg)
	other.Start(newRecorder(t))
	t.Cleanup(func() { closeBus(t, other) })
	for _, tenant := range f.tenants {
		mustSubscribe(t, f.bus, tenant)
		mustSubscribe(t, other, tenant)
	}

	first := firstSlots(t, f)
	want := map[string]string{}
	for addr, slot := range first {
		want[addr] = clusterNames.ShardLiveness(slot)
	}
	waitLiveChannels(t, f.bus, want)
	waitLiveChannels(t, other, want)

	ctx := testContext(t)
	for addr, ch := range want {
		m := redis.NewClient(&redis.Options{Addr: addr})
		slot, err := m.ClusterKeySlot(ctx, ch).Result()
		m.Close()
		if err != nil || int(slot) != first[addr] {
			t.Fatalf("%s: CLUSTER KEYSLOT %s = %d, %v; want its first slot %d", addr, ch, slot, err, first[addr])
		}
		if owner := f.c.MasterOf(ch); owner != addr {
			t.Fatalf("%s: its liveness channel %s is served by %s", addr, ch, owner)
		}
	}

	// Both buses publish on the same three channels and hear every message
	// there; each counts its own. Wait until each sent enough that the
	// other's messages, were they counted, would show.
	for _, b := range []*ClusterBus{f.bus, other} {
		testenv.Eventually(t, "30 liveness messages sent", func() bool { return b.Stats().LivenessSent >= 30 })
	}
	closeBus(t, other)
	closeBus(t, f.bus)
	for i, b := range []*ClusterBus{f.bus, other} {
		// A message whose SPUBLISH failed (timed out) may still be heard,
		// and so may the one in flight at Close.
		if s := b.Stats(); s.LivenessHeard == 0 || s.LivenessHeard > s.LivenessSent+s.LivenessFailures+1 || s.Losses != 0 {
			t.Fatalf("bus %d: stats %+v: want its own liveness messages heard, no more, and no loss", i, s)
		}
	}

	pipe := f.cl.Pipeline()
	cmds := make([]*redis.IntCmd, 16384)
	for s := range cmds {
		cmds[s] = pipe.ClusterKeySlot(ctx, clusterNames.ShardLiveness(s))
	}
	if _, err := pipe.Exec(ctx); err != nil {
		t.Fatalf("CLUSTER KEYSLOT of every slot's liveness channel: %v", err)
	}
	for s, c := range cmds {
		if c.Val() != int64(s) {
			t.Fatalf("CLUSTER KEYSLOT %s = %d, want %d", clusterNames.ShardLiveness(s), c.Val(), s)
		}
	}
}

// Migrating a master's first slot away makes its shard drop the liveness
// channel: the bus replaces the shard without a loss, and the new shard's
// channel is named after the master's new first slot, while the other
// masters' channels stay as they were.
func TestClusterBusLivenessChannelFollowsAMigration(t *testing.T) {
	f := newClusterFixtureWith(t, 1, BusConfig{LivenessInterval: 100 * time.Millisecond, LivenessTimeout: 10 * time.Second}, nil)
	for _, tenant := range f.tenants {
		mustSubscribe(t, f.bus, tenant)
	}
	first := firstSlots(t, f)
	want := map[string]string{}
	for addr, slot := range first {
		want[addr] = clusterNames.ShardLiveness(slot)
	}
	waitLiveChannels(t, f.bus, want)

	var from string
	for addr, slot := range first {
		if from == "" || slot < first[from] {
			from = addr
		}
	}
	to := f.c.OtherMaster(from)
	f.c.MoveSlot(want[from], to)
	// The master's first range lost its first slot; nothing else moved.
	want[from] = clusterNames.ShardLiveness(first[from] + 1)
	waitLiveChannels(t, f.bus, want)
	if got := firstSlots(t, f)[from]; got != first[from]+1 {
		t.Fatalf("%s: first slot %d after the migration, want %d", from, got, first[from]+1)
	}

	f.publishAll(t, f.tenants, 1)
	none(t, f.r.lost, fmt.Sprintf("Lost after %s's liveness slot migrated", from))
	if s := f.bus.Stats(); s.Losses != 0 {
		t.Fatalf("stats %+v: want no loss", s)
	}
	f.noCrossSlot(t)
}
