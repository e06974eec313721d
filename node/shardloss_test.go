package node_test

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pushd/pushd/fanout"
	"github.com/pushd/pushd/hub"
	"github.com/pushd/pushd/internal/testenv"
	"github.com/pushd/pushd/keys"
	"github.com/pushd/pushd/node"
	"github.com/pushd/pushd/snapshot/rediswrite"
)

var clusterNames = keys.Names{Cluster: true}

// shardTenant is a tenant of the shard-loss test: its task (whose snapshot
// lives on a master that stays up), an SSE and a WebSocket watcher, and
// the last version each saw.
type shardTenant struct {
	id, task string
	ws       []*watcher
	last     []int64
}

// write is the Task State Service: PostgreSQL, then the snapshot in the
// cluster, announced on the tenant's shard channel or not.
func (st *shardTenant) write(t *testing.T, pg testenv.Postgres, cc *redis.ClusterClient, version int64, announce bool) {
	t.Helper()
	pg.InsertTask(t, testenv.Task{ID: st.task, TenantID: st.id, ProjectID: "p1", UserID: "u1", Status: "RUNNING", Progress: int(version), Version: version})
	s := parseDoc(t, doc(st.task, st.id, version, "RUNNING"))
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	err := testenv.Retry(ctx, func() error {
		var err error
		if announce {
			_, err = fanout.NewRedisPublisher(cc, clusterNames).Publish(ctx, s)
		} else {
			_, err = rediswrite.Write(ctx, cc, clusterNames, s, 0, "", nil)
		}
		if err != nil {
			// After a failover the test's client may still know the old
			// master; the Task State Service retries too.
			cc.ReloadState(ctx)
		}
		return err
	})
	if err != nil {
		t.Fatalf("write %s v%d: %v", st.task, version, err)
	}
}

func (st *shardTenant) waitVersion(t *testing.T, v int64) {
	t.Helper()
	for i, w := range st.ws {
		w.waitVersion(t, v, &st.last[i])
	}
}

// waitVersionNoMode is waitVersion failing on any mode event: the tenant's
// connections must stay in their mode.
func (st *shardTenant) waitVersionNoMode(t *testing.T, v int64) {
	t.Helper()
	for i, w := range st.ws {
		for st.last[i] < v {
			s, ok := w.task(t)
			if !ok {
				t.Fatalf("%s of %s: a mode event while its shard was up", w.name, st.id)
			}
			if s.Version <= st.last[i] {
				t.Fatalf("%s of %s: version went from %d to %d", w.name, st.id, st.last[i], s.Version)
			}
			st.last[i] = s.Version
		}
	}
}

// A Redis Cluster master dies and its replica is kept from taking over
// until the test says: only the tenant whose channel lived on that master
// is told polling, and its changes keep arriving by polling; the tenant on
// another master stays in push mode, hears no mode event, and its changes
// keep arriving by notification. When the replica takes over, the polled
// tenant is told push and is pushed again.
func TestClusterShardLostOnlyItsTenantsPoll(t *testing.T) {
	// Registered first, so it runs after every client closed: the clients
	// that dialed the dead master retry in the background for a second.
	t.Cleanup(func() { testenv.WaitDialRetriesEnded(t) })
	c := testenv.StartRedisCluster(t, 3)
	pg := testenv.Database(t)
	cc := c.Client()
	// The masters that stay serve their slots while one is down, and the
	// dead master's replica waits for the test.
	c.ConfigSet("cluster-require-full-coverage", "no")
	victim := c.Masters()[0]
	replica := c.ReplicaOf(victim.Addr)
	replica.ConfigSet("cluster-replica-no-failover", "yes")

	_, byOwner := c.Spread(1, func(i int) string { return testenv.UniqueID("shard") + "x" }, clusterNames.Channel)
	lostT := &shardTenant{id: byOwner[victim.Addr][0]}
	keptT := &shardTenant{id: byOwner[c.OtherMaster(victim.Addr)][0]}
	for _, st := range []*shardTenant{lostT, keptT} {
		for st.task == "" {
			if id := testenv.UniqueID("task"); c.MasterOf(clusterNames.Snapshot(id)) != victim.Addr {
				st.task = id
			}
		}
	}

	s := startNode(t, node.Config{RedisURL: c.Seeds, RedisCluster: true, DatabaseURL: pg.URL, Hub: hub.Config{PollInterval: 300 * time.Millisecond}})
	for _, st := range []*shardTenant{lostT, keptT} {
		st.write(t, pg, cc, 1, true)
		tok := token(t, st.id, "u1")
		w := openWS(t, s.URL, tok)
		w.send(t, map[string]any{"op": "subscribe", "id": 1, "tasks": []string{st.task}})
		st.ws = []*watcher{sseWatcher(openSSE(t, s.URL, tok, "task="+st.task)), wsWatcher(w)}
		st.last = make([]int64, len(st.ws))
		st.waitVersion(t, 1)
	}

	killed := time.Now()
	victim.Stop()
	for _, w := range lostT.ws {
		w.waitMode(t, "polling")
	}
	t.Logf("the lost shard's tenant's clients in polling mode %v after its master was killed", time.Since(killed).Round(time.Millisecond))
	// The lost tenant's changes arrive by polling (no notification
	// announces them); the other tenant's by notification, and it is told
	// nothing: a mode event would come before its task.
	written := time.Now()
	lostT.write(t, pg, cc, 2, false)
	lostT.waitVersion(t, 2)
	t.Logf("a change no notification announced reached them %v later, by polling", time.Since(written).Round(time.Millisecond))
	keptT.write(t, pg, cc, 2, true)
	keptT.waitVersionNoMode(t, 2)
	wantMetric(t, s.AdminURL, `pushd_polling_tenants 1`)
	wantMetric(t, s.AdminURL, `pushd_mode{mode="push"} 1`)
	wantMetric(t, s.AdminURL, `pushd_mode_switches_total 0`)

	allowed := time.Now()
	replica.ConfigSet("cluster-replica-no-failover", "no") // it takes over the dead master's slots
	for _, w := range lostT.ws {
		w.waitMode(t, "push")
	}
	t.Logf("back in push mode %v after the replica was allowed to take over", time.Since(allowed).Round(time.Millisecond))
	wantMetric(t, s.AdminURL, `pushd_polling_tenants 0`)
	// Both are pushed again; the kept tenant heard no mode event at all.
	lostT.write(t, pg, cc, 3, true)
	lostT.waitVersionNoMode(t, 3)
	keptT.write(t, pg, cc, 3, true)
	keptT.waitVersionNoMode(t, 3)
}
