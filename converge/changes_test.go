package converge_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"

	"github.com/pushd/pushd/converge"
	"github.com/pushd/pushd/fanout"
	"github.com/pushd/pushd/internal/testenv"
	"github.com/pushd/pushd/snapshot"
	"github.com/pushd/pushd/snapshot/store"
)

// env is a test's Redis prefix and the package's database, with what a
// node gives its change reader.
type env struct {
	r     testenv.Redis
	pg    testenv.Postgres
	store *store.Store
	pub   *fanout.RedisPublisher
}

func newEnv(t *testing.T) env {
	t.Helper()
	r := testenv.SharedRedis(t)
	pg := testenv.Database(t)
	s := store.New(store.Config{Redis: r.Client, DB: pg.Pool, Names: r.Names})
	t.Cleanup(s.Close)
	return env{r: r, pg: pg, store: s, pub: fanout.NewRedisPublisher(r.Client, r.Names)}
}

// reader starts a change reader of node; Close is the test's cleanup.
func (e env) reader(t *testing.T, node string) *converge.ChangeReader {
	t.Helper()
	cfg, err := pgx.ParseConfig(e.pg.URL)
	if err != nil {
		t.Fatal(err)
	}
	r := converge.NewChangeReader(converge.ChangesConfig{Listen: cfg, Rows: e.store, Publisher: e.pub,
		Redis: e.r.Client, Names: e.r.Names, Node: node, LeaseTTL: 1500 * time.Millisecond})
	r.Start()
	t.Cleanup(r.Close)
	return r
}

func leading(t *testing.T, r *converge.ChangeReader) {
	t.Helper()
	testenv.Eventually(t, "the reader leads", func() bool { return r.Stats().Leading })
}

// commit writes a task's row, as a Task State Service that neither writes
// Redis nor publishes: the row alone.
func (e env) commit(t *testing.T, id string, version int64, status, extra string) {
	t.Helper()
	_, err := e.pg.Pool.Exec(testenv.Context(t), `INSERT INTO generation_tasks (id, tenant_id, status, version, updated_at, extra)
		VALUES ($1, 't1', $2, $3, now(), $4)
		ON CONFLICT (id) DO UPDATE SET status = EXCLUDED.status, version = EXCLUDED.version,
			updated_at = EXCLUDED.updated_at, extra = EXCLUDED.extra`, id, status, version, extra)
	if err != nil {
		t.Fatal(err)
	}
}

// stored is the snapshot Redis holds for id, nil for none.
func (e env) stored(t *testing.T, id string) *snapshot.Snapshot {
	t.Helper()
	b, err := e.r.Client.Get(testenv.Context(t), e.r.Names.Snapshot(id)).Bytes()
	if err != nil {
		return nil
	}
	s, err := snapshot.Parse(b)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func (e env) waitStored(t *testing.T, id string, version int64) *snapshot.Snapshot {
	t.Helper()
	var s *snapshot.Snapshot
	testenv.Eventually(t, "Redis holds "+id, func() bool {
		s = e.stored(t, id)
		return s != nil && s.Version >= version
	})
	if s.Version != version {
		t.Fatalf("Redis holds %s v%d, want v%d", id, s.Version, version)
	}
	return s
}

// hints subscribes to tenant t1's channel.
func (e env) hints(t *testing.T) <-chan *redis.Message {
	t.Helper()
	sub := e.r.Client.Subscribe(testenv.Context(t), e.r.Names.Channel("t1"))
	t.Cleanup(func() { sub.Close() })
	if _, err := sub.Receive(testenv.Context(t)); err != nil {
		t.Fatal(err)
	}
	return sub.Channel()
}

// nextHint is the version of the next hint of task id. Hints of other
// tasks (the package's other tests' rows, which a reader that starts
// catches up on) are passed.
func nextHint(t *testing.T, hints <-chan *redis.Message, id string) int64 {
	t.Helper()
	deadline := time.After(testenv.Wait)
	for {
		select {
		case m := <-hints:
			var n struct {
				TaskID  string `json:"task_id"`
				Version int64  `json:"version"`
			}
			if err := json.Unmarshal([]byte(m.Payload), &n); err != nil {
				t.Fatalf("hint %q: %v", m.Payload, err)
			}
			if n.TaskID == id {
				return n.Version
			}
		case <-deadline:
			t.Fatalf("no hint of %s", id)
		}
	}
}

// A row committed alone is stored in Redis, with its extra, and announced
// on its tenant's channel; a lower version committed after a higher one
// (a writer without the version guard) is never stored nor announced.
func TestCommittedRowIsStoredAndAnnounced(t *testing.T) {
	e := newEnv(t)
	hints := e.hints(t)
	r := e.reader(t, "node0")
	leading(t, r)
	id := testenv.UniqueID("task")

	e.commit(t, id, 1, "QUEUED", `{}`)
	if v := nextHint(t, hints, id); v != 1 {
		t.Fatalf("hint v%d, want v1", v)
	}
	e.commit(t, id, 2, "SUCCEEDED", `{"output_url": "https://cdn.example/v.mp4"}`)
	if v := nextHint(t, hints, id); v != 2 {
		t.Fatalf("hint v%d, want v2", v)
	}
	if s := e.waitStored(t, id, 2); s.Status != "SUCCEEDED" || !strings.HasSuffix(string(s.JSON()), `"output_url":"https://cdn.example/v.mp4"}`) {
		t.Errorf("Redis holds %s, want v2 with its output_url", s.JSON())
	}

	stale := r.Stats().Stale
	e.commit(t, id, 1, "QUEUED", `{}`)
	testenv.Eventually(t, "the lower version is read", func() bool { return r.Stats().Stale > stale })
	e.commit(t, id, 3, "SUCCEEDED", `{}`)
	if v := nextHint(t, hints, id); v != 3 {
		t.Fatalf("hint v%d after a lower version, want v3 and nothing between", v)
	}
	e.waitStored(t, id, 3)
}

// What is committed while no reader listens, a reader that takes the
// lease next lists and publishes.
func TestTakeoverCatchesUpWhatNoOneHeard(t *testing.T) {
	e := newEnv(t)
	a := e.reader(t, "node-a")
	leading(t, a)
	x, y := testenv.UniqueID("task"), testenv.UniqueID("task")
	e.commit(t, x, 1, "RUNNING", `{}`)
	e.waitStored(t, x, 1)
	testenv.Eventually(t, "the heard point is recorded", func() bool {
		heard, _ := e.r.Client.HGet(testenv.Context(t), e.r.Names.ChangeReaders(), "heard").Int64()
		return heard > time.Now().Add(-time.Minute).UnixMicro()
	})
	a.Close()

	e.commit(t, x, 2, "RUNNING", `{}`)
	e.commit(t, y, 1, "QUEUED", `{}`)
	b := e.reader(t, "node-b")
	leading(t, b)
	e.waitStored(t, x, 2)
	e.waitStored(t, y, 1)
	if c := b.Stats().CaughtUp; c < 2 {
		t.Errorf("caught up %d rows, want both changes at least", c)
	}
}

// A reader whose lease another took (its node froze past the TTL) stops
// at its next renewal; the new holder ends its connection.
func TestAReaderThatLostItsLeaseStops(t *testing.T) {
	e := newEnv(t)
	a := e.reader(t, "node-a")
	leading(t, a)
	b := e.reader(t, "node-b")
	if err := e.r.Client.Del(testenv.Context(t), e.r.Names.ChangeReader()).Err(); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, "one reader leads and listens, named by the lease; the other stopped", func() bool {
		sa, sb := a.Stats(), b.Stats()
		if sa.Leading == sb.Leading || sa.Leads+sb.Leads < 2 {
			return false
		}
		holder, _ := e.r.Client.HGet(testenv.Context(t), e.r.Names.ChangeReader(), "node").Result()
		var listening int
		err := e.pg.Pool.QueryRow(context.Background(), `SELECT count(*) FROM pg_stat_activity
			WHERE application_name = $1 AND datname = current_database()`, "pushd change reader "+e.r.Names.Prefix).Scan(&listening)
		return err == nil && listening == 1 && holder == map[bool]string{true: "node-a", false: "node-b"}[sa.Leading]
	})
}

// heldPublisher holds the publishes of one task until released, as a slow
// Redis master would: the rest go through.
type heldPublisher struct {
	fanout.Publisher
	held    string
	reached chan struct{} // closed when the held task's publish first begins
	once    sync.Once
	release chan struct{}
}

func (p *heldPublisher) Publish(ctx context.Context, s *snapshot.Snapshot) (bool, error) {
	if s.TaskID == p.held {
		p.once.Do(func() { close(p.reached) })
		select {
		case <-p.release:
		case <-ctx.Done():
			return false, ctx.Err()
		}
	}
	return p.Publisher.Publish(ctx, s)
}

// A publish that hangs (a slow master) holds back only its own flush: the
// lease is renewed meanwhile, a row committed after it is published while
// it still hangs, and the held one once it is let go.
func TestChangesFlushPastAHeldPublish(t *testing.T) {
	e := newEnv(t)
	slow, fast := testenv.UniqueID("slow"), testenv.UniqueID("fast")
	pub := &heldPublisher{Publisher: e.pub, held: slow, reached: make(chan struct{}), release: make(chan struct{})}
	cfg, err := pgx.ParseConfig(e.pg.URL)
	if err != nil {
		t.Fatal(err)
	}
	r := converge.NewChangeReader(converge.ChangesConfig{Listen: cfg, Rows: e.store, Publisher: pub,
		Redis: e.r.Client, Names: e.r.Names, Node: "held", LeaseTTL: 1500 * time.Millisecond})
	r.Start()
	t.Cleanup(r.Close)
	leading(t, r)

	e.commit(t, slow, 1, "RUNNING", "{}")
	<-pub.reached
	// The lease is renewed while the publish hangs: the reader's loop goes
	// on (the point it heard up to waits for the held flush).
	// A renewal is the TTL rising above the lowest seen since: the first
	// reading may come right after one, at the whole TTL.
	ttl := func() time.Duration { return e.r.Client.PTTL(testenv.Context(t), e.r.Names.ChangeReader()).Val() }
	lowest := ttl()
	testenv.Eventually(t, "the lease renewed while a publish hangs", func() bool {
		now := ttl()
		lowest = min(lowest, now)
		return now > lowest
	})
	e.commit(t, fast, 1, "RUNNING", "{}")
	e.waitStored(t, fast, 1)
	if s := e.stored(t, slow); s != nil {
		t.Fatalf("Redis holds %s v%d while its publish is held", slow, s.Version)
	}
	close(pub.release)
	e.waitStored(t, slow, 1)
}

// refusingPublisher refuses the first publish of one task once the test
// lets it, as a Redis that timed out would: the rest go through.
type refusingPublisher struct {
	fanout.Publisher
	refused string
	reached chan struct{} // closed when the refused task's publish begins
	release chan struct{}
	once    sync.Once
}

func (p *refusingPublisher) Publish(ctx context.Context, s *snapshot.Snapshot) (bool, error) {
	refuse := false
	if s.TaskID == p.refused {
		p.once.Do(func() { refuse = true; close(p.reached) })
	}
	if refuse {
		<-p.release
		return false, errors.New("refused")
	}
	return p.Publisher.Publish(ctx, s)
}

// The fleet's first lead, which no reader heard anything before, lists
// from Grace before it listens; when its catch-up fails, the next lead
// lists from there too, however long the first took, not from Grace
// before its own listening.
func TestAFailedFirstCatchUpIsListedAgain(t *testing.T) {
	e := newEnv(t)
	id := testenv.UniqueID("task")
	e.commit(t, id, 1, "RUNNING", "{}")
	pub := &refusingPublisher{Publisher: e.pub, refused: id, reached: make(chan struct{}), release: make(chan struct{})}
	cfg, err := pgx.ParseConfig(e.pg.URL)
	if err != nil {
		t.Fatal(err)
	}
	const grace = 2 * time.Second
	r := converge.NewChangeReader(converge.ChangesConfig{Listen: cfg, Rows: e.store, Publisher: pub,
		Redis: e.r.Client, Names: e.r.Names, Node: "first", LeaseTTL: 1500 * time.Millisecond, Grace: grace})
	r.Start()
	t.Cleanup(r.Close)
	<-pub.reached
	testenv.Eventually(t, "PostgreSQL's clock is past the row by more than Grace", func() bool {
		var past bool
		err := e.pg.Pool.QueryRow(testenv.Context(t), `SELECT now() > updated_at + $2::interval
			FROM generation_tasks WHERE id = $1`, id, grace.String()).Scan(&past)
		return err == nil && past
	})
	close(pub.release)
	e.waitStored(t, id, 1)
	if s := r.Stats(); s.Failures < 1 || s.Leads < 2 {
		t.Errorf("%d leads, %d failed: want the first to fail and a second", s.Leads, s.Failures)
	}
}
