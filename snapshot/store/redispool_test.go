package store_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pushd/pushd/internal/testenv"
	"github.com/pushd/pushd/snapshot"
	"github.com/pushd/pushd/snapshot/store"
)

// TestPoolWaitSkipsNoLaterRead: a read whose time runs out while it waits
// for one of the node's pooled Redis connections falls back to PostgreSQL,
// and the next read still asks Redis. The node was busy, not Redis; a
// backoff would send every read to PostgreSQL for a second.
func TestPoolWaitSkipsNoLaterRead(t *testing.T) {
	t.Parallel()
	r := testenv.SharedRedis(t)
	pg := testenv.Database(t)
	client := onePool(t, r)
	// A plain GET (no negative cache) runs on the main pool, the one held.
	s := newStore(t, store.Config{Redis: client, DB: pg.Pool, Names: r.Names,
		CacheTTL: -1, NegativeTTL: -1, FetchTimeout: 400 * time.Millisecond})

	waited, after := testenv.UniqueID("task"), testenv.UniqueID("task")
	for _, id := range []string{waited, after} {
		pg.InsertTask(t, testenv.Task{ID: id, TenantID: "t1", ProjectID: "p1", UserID: "u1", Status: "RUNNING", Version: 3})
	}
	e := env{r: r, pg: pg, store: s}
	e.write(t, after, "RUNNING", 3)

	release := hold(t, r, client)
	before := s.Stats()
	if got := mustGet(t, s, waited, 0); got.Origin != snapshot.OriginPostgres {
		t.Fatalf("read waiting for the held connection came from %v, want PostgreSQL", got.Origin)
	}
	if d := s.Stats(); d.RedisErrors != before.RedisErrors || d.RedisPoolWaits != before.RedisPoolWaits+1 {
		t.Fatalf("Redis errors +%d, pool waits +%d; want 0 and 1", d.RedisErrors-before.RedisErrors, d.RedisPoolWaits-before.RedisPoolWaits)
	}

	release()
	// Within the second a Redis failure would skip Redis for.
	if got := mustGet(t, s, after, 0); got.Origin != snapshot.OriginRedis {
		t.Errorf("the read after the wait came from %v, want Redis", got.Origin)
	}
	if d := s.Stats(); d.RedisSkipped != before.RedisSkipped {
		t.Errorf("%d reads skipped Redis after a wait for a connection", d.RedisSkipped-before.RedisSkipped)
	}
}

// onePool is a client of r's server with a single pooled connection.
func onePool(t *testing.T, r testenv.Redis) *redis.Client {
	t.Helper()
	opt := *r.Client.Options()
	opt.PoolSize, opt.ClientName = 1, "onepool_"+testenv.RandomSuffix(8)
	client := redis.NewClient(&opt)
	t.Cleanup(func() { client.Close() })
	return client
}

// hold has a blocking pop hold client's one connection until release,
// and returns once Redis runs the pop.
func hold(t *testing.T, r testenv.Redis, client *redis.Client) (release func()) {
	t.Helper()
	ctx := testenv.Context(t)
	list := r.Names.Prefix + "hold"
	popped := make(chan error, 1)
	go func() { popped <- client.BLPop(ctx, 30*time.Second, list).Err() }()
	for !blocked(r.Client.ClientList(ctx).Val(), client.Options().ClientName) {
		time.Sleep(5 * time.Millisecond)
	}
	return func() {
		t.Helper()
		if err := r.Client.LPush(ctx, list, "go").Err(); err != nil {
			t.Fatal(err)
		}
		if err := <-popped; err != nil {
			t.Fatal(err)
		}
	}
}

// blocked reports whether CLIENT LIST's reply shows the client named name
// in a blocking pop.
func blocked(clients, name string) bool {
	for _, line := range strings.Split(clients, "\n") {
		if strings.Contains(line, " name="+name+" ") && strings.Contains(line, " cmd=blpop ") {
			return true
		}
	}
	return false
}

// TestCallersReadsShareAnMGET: the reads of a herd of new connections,
// queued while one read waits for the only pooled connection, go to Redis
// in one more round trip, not one each.
func TestCallersReadsShareAnMGET(t *testing.T) {
	t.Parallel()
	r := testenv.SharedRedis(t)
	ctx := testenv.Context(t)
	client := onePool(t, r)
	// A read's share of the fetch timeout (2 s) outlasts the hold below.
	s := newStore(t, store.Config{Redis: client, Names: r.Names, CacheTTL: -1, FetchTimeout: 8 * time.Second})
	e := env{r: r, store: s}
	const herd = 50
	ids := make([]string, herd)
	for i := range ids {
		ids[i] = testenv.UniqueID("task")
		e.write(t, ids[i], "RUNNING", 2)
	}

	release := hold(t, r, client)
	before := s.Stats()
	got := make(chan error, herd)
	for _, id := range ids {
		go func() {
			snap, err := s.Get(ctx, id, 0)
			if err == nil && (snap.Origin != snapshot.OriginRedis || snap.Version != 2) {
				err = fmt.Errorf("%s: version %d from %v, want 2 from Redis", id, snap.Version, snap.Origin)
			}
			got <- err
		}()
	}
	// Every read queued, or in the first MGET, which waits for the pool.
	// Reads that do not queue never get there: they wait for the pool.
	for give := time.Now().Add(10 * time.Second); store.AsksPending(s) < herd; time.Sleep(time.Millisecond) {
		if time.Now().After(give) {
			t.Fatalf("%d of %d reads queued to share a round trip", store.AsksPending(s), herd)
		}
	}
	release()
	for range herd {
		if err := <-got; err != nil {
			t.Error(err)
		}
	}
	if n := s.Stats().RedisReads - before.RedisReads; n > 2 {
		t.Errorf("%d reads took %d round trips to Redis, want at most 2", herd, n)
	}
}
