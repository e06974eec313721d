package sim_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pushd/pushd/fanout"
	"github.com/pushd/pushd/internal/testenv"
	"github.com/pushd/pushd/snapshot"
	"github.com/pushd/pushd/web/sim"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// recorder is a Publisher that keeps what it was given; fail, when set,
// refuses the matching publishes.
type recorder struct {
	mu    sync.Mutex
	snaps []*snapshot.Snapshot
	fail  func(*snapshot.Snapshot) bool
}

func (r *recorder) Publish(_ context.Context, s *snapshot.Snapshot) (bool, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.fail != nil && r.fail(s) {
		return false, errors.New("refused")
	}
	r.snaps = append(r.snaps, s)
	return true, nil
}

func (r *recorder) states(t *testing.T) []sim.State {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]sim.State, len(r.snaps))
	for i, s := range r.snaps {
		if err := json.Unmarshal(s.JSON(), &out[i]); err != nil {
			t.Fatal(err)
		}
	}
	return out
}

var spec = sim.Spec{TenantID: "t1", ProjectID: "p1", UserID: "u1", Kind: sim.TextToVideo, Prompt: "a red fox in the snow"}

// checkWalk checks the rules every walk follows: versions 1, 2, 3...;
// statuses in the order of the pipeline; queue positions counting down;
// progress never going back.
func checkWalk(t *testing.T, states []sim.State) {
	t.Helper()
	order := map[string]int{sim.StatusQueued: 0, sim.StatusRunning: 1, sim.StatusProviderSubmitted: 2,
		sim.StatusPostProcessing: 3, sim.StatusSucceeded: 4, sim.StatusFailed: 4}
	for i, st := range states {
		if st.Version != int64(i+1) {
			t.Fatalf("state %d has version %d", i, st.Version)
		}
		if st.TenantID != spec.TenantID || st.ProjectID != spec.ProjectID || st.UserID != spec.UserID || st.TaskID != states[0].TaskID {
			t.Fatalf("state %d: ids %+v", i, st)
		}
		if i == 0 {
			continue
		}
		prev := states[i-1]
		if order[st.Status] < order[prev.Status] || st.Progress < prev.Progress {
			t.Fatalf("state %d (%s %d%%) goes back from %s %d%%", i, st.Status, st.Progress, prev.Status, prev.Progress)
		}
		if st.Status == sim.StatusQueued && *st.QueuePosition != *prev.QueuePosition-1 {
			t.Fatalf("queue position %d after %d", *st.QueuePosition, *prev.QueuePosition)
		}
		if st.Status != sim.StatusQueued && st.QueuePosition != nil {
			t.Fatalf("state %d (%s) keeps queue position %d", i, st.Status, *st.QueuePosition)
		}
	}
}

func TestPlanSucceeds(t *testing.T) {
	states := sim.Plan(spec, "vid_1", 3)
	checkWalk(t, states)
	seen := map[string]bool{}
	for _, st := range states {
		seen[st.Status] = true
	}
	for _, s := range []string{sim.StatusQueued, sim.StatusRunning, sim.StatusProviderSubmitted, sim.StatusPostProcessing, sim.StatusSucceeded} {
		if !seen[s] {
			t.Errorf("no %s state", s)
		}
	}
	if *states[0].QueuePosition != 3 || *states[2].QueuePosition != 1 {
		t.Errorf("queue positions %d..%d, want 3..1", *states[0].QueuePosition, *states[2].QueuePosition)
	}
	last := states[len(states)-1]
	if last.Status != sim.StatusSucceeded || last.Progress != 100 || last.OutputAssetID == nil ||
		last.OutputURL != sim.AssetPath+*last.OutputAssetID+".svg" || last.ErrorCode != nil {
		t.Fatalf("last state %+v", last)
	}
	if last.Provider != "veo" || last.Model != "veo-3" {
		t.Errorf("text to video on %s %s", last.Provider, last.Model)
	}
}

func TestPlanFails(t *testing.T) {
	s := spec
	s.Fail, s.Kind = true, sim.ImageToVideo
	states := sim.Plan(s, "vid_2", 1)
	checkWalk(t, states)
	last := states[len(states)-1]
	if last.Status != sim.StatusFailed || last.ErrorCode == nil || *last.ErrorCode == "" || last.ErrorMessage == "" || last.OutputAssetID != nil {
		t.Fatalf("last state %+v", last)
	}
	if last.Progress <= 0 || last.Progress >= 100 {
		t.Errorf("failed at %d%%, want part way", last.Progress)
	}
	if last.Provider != "kling" {
		t.Errorf("image to video on %s", last.Provider)
	}
}

// The walk's timing is the subject, so it runs on synctest's clock.
func TestWalkPublishesEveryStateOneStepApart(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rec := &recorder{}
		const step = time.Second
		s := sim.New(sim.Config{Publisher: rec, Step: step})
		defer s.Close()
		start := time.Now()
		first, err := s.Start(context.Background(), spec)
		if err != nil {
			t.Fatal(err)
		}
		if first.Version != 1 || first.Status != sim.StatusQueued {
			t.Fatalf("first snapshot %s", first.JSON())
		}
		if got := len(rec.states(t)); got != 1 {
			t.Fatalf("%d states published by Start, want 1", got)
		}
		for s.Running() > 0 {
			time.Sleep(step / 2) // the fake clock: each sleep lets the walk take its next step
			synctest.Wait()
		}
		states := rec.states(t)
		checkWalk(t, states)
		if last := states[len(states)-1]; last.Status != sim.StatusSucceeded {
			t.Fatalf("walk ended at %s", last.Status)
		}
		if took, want := time.Since(start), time.Duration(len(states)-1)*step; took < want || took > want+step {
			t.Fatalf("walk of %d states took %v, want %v", len(states), took, want)
		}
	})
}

func TestBoundsPerNodeAndPerTenant(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := sim.New(sim.Config{Publisher: &recorder{}, Step: time.Second, MaxTasks: 3, MaxPerTenant: 2})
		defer s.Close()
		start := func(tenant string) error {
			sp := spec
			sp.TenantID = tenant
			_, err := s.Start(context.Background(), sp)
			return err
		}
		for _, tenant := range []string{"a", "a", "b"} {
			if err := start(tenant); err != nil {
				t.Fatal(err)
			}
		}
		if err := start("c"); !errors.Is(err, sim.ErrBusy) {
			t.Fatalf("a 4th task on a node of 3: %v, want ErrBusy", err)
		}
		for s.Running() > 0 {
			time.Sleep(time.Second)
			synctest.Wait()
		}
		if err := start("a"); err != nil {
			t.Fatal(err)
		}
		if err := start("a"); err != nil {
			t.Fatal(err)
		}
		if err := start("a"); !errors.Is(err, sim.ErrBusy) {
			t.Fatalf("a 3rd task of a tenant of 2: %v, want ErrBusy", err)
		}
		if err := start("b"); err != nil {
			t.Fatalf("another tenant: %v", err)
		}
	})
}

func TestCloseStopsWalks(t *testing.T) {
	rec := &recorder{}
	s := sim.New(sim.Config{Publisher: rec, Step: time.Hour})
	for range 5 {
		if _, err := s.Start(context.Background(), spec); err != nil {
			t.Fatal(err)
		}
	}
	s.Close() // would hang for an hour if a walk did not end on Close
	s.Close()
	if n := s.Running(); n != 0 {
		t.Fatalf("%d running after Close", n)
	}
	if _, err := s.Start(context.Background(), spec); !errors.Is(err, sim.ErrClosed) {
		t.Fatalf("Start after Close: %v", err)
	}
	if n := len(rec.states(t)); n != 5 {
		t.Fatalf("%d states published, want only the 5 first", n)
	}
}

func TestFailedPublishDoesNotStopTheWalk(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rec := &recorder{fail: func(s *snapshot.Snapshot) bool { return s.Version == 5 }}
		s := sim.New(sim.Config{Publisher: rec, Step: time.Second})
		defer s.Close()
		if _, err := s.Start(context.Background(), spec); err != nil {
			t.Fatal(err)
		}
		for s.Running() > 0 {
			time.Sleep(time.Second)
			synctest.Wait()
		}
		states := rec.states(t)
		if last := states[len(states)-1]; last.Status != sim.StatusSucceeded {
			t.Fatalf("walk ended at %s", last.Status)
		}
		for _, st := range states {
			if st.Version == 5 {
				t.Fatal("the refused version was recorded")
			}
		}
	})
}

func TestFirstPublishFailingFailsStart(t *testing.T) {
	s := sim.New(sim.Config{Publisher: &recorder{fail: func(*snapshot.Snapshot) bool { return true }}})
	defer s.Close()
	if _, err := s.Start(context.Background(), spec); err == nil {
		t.Fatal("Start succeeded with a publisher that refuses")
	}
	if n := s.Running(); n != 0 {
		t.Fatalf("%d running after a failed Start", n)
	}
}

func TestInvalidSpecs(t *testing.T) {
	s := sim.New(sim.Config{Publisher: &recorder{}})
	defer s.Close()
	for _, sp := range []sim.Spec{
		{TenantID: "t 1", ProjectID: "p", UserID: "u"},
		{TenantID: "t", ProjectID: "", UserID: "u"},
		{TenantID: "t", ProjectID: "p", UserID: "u", Kind: "audio"},
	} {
		if _, err := s.Start(context.Background(), sp); err == nil {
			t.Errorf("Start(%+v) succeeded", sp)
		}
	}
}

// Through the embedded mode's publisher, the store ends at the last state.
func TestMemoryPublisherEndsAtTheLastVersion(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := snapshot.NewMemoryStore()
		s := sim.New(sim.Config{Publisher: fanout.MemoryPublisher{Store: store}, Step: time.Second})
		defer s.Close()
		sp := spec
		sp.Fail = true
		first, err := s.Start(context.Background(), sp)
		if err != nil {
			t.Fatal(err)
		}
		for s.Running() > 0 {
			time.Sleep(time.Second)
			synctest.Wait()
		}
		got, err := store.Get(context.Background(), first.TaskID, 0)
		if err != nil {
			t.Fatal(err)
		}
		want := sim.Plan(sp, first.TaskID, 1)
		if got.Status != sim.StatusFailed || got.Version < int64(len(want)) {
			t.Fatalf("stored %s", got.JSON())
		}
	})
}

// committed is a Publisher that checks, at each publish, that the state is
// in PostgreSQL already, as a Task State Service commits before it
// announces; it closes done at a terminal state.
type committed struct {
	pg   testenv.Postgres
	done chan struct{}

	mu       sync.Mutex
	versions []int64
	behind   []string // publishes that found the row older
}

func (c *committed) Publish(ctx context.Context, s *snapshot.Snapshot) (bool, error) {
	var version int64
	var status string
	err := c.pg.Pool.QueryRow(ctx, `SELECT version, status FROM generation_tasks WHERE id = $1`, s.TaskID).Scan(&version, &status)
	c.mu.Lock()
	defer c.mu.Unlock()
	if err != nil || version != s.Version || status != s.Status {
		c.behind = append(c.behind, fmt.Sprintf("v%d %s published, PostgreSQL has v%d %s (%v)", s.Version, s.Status, version, status, err))
	}
	c.versions = append(c.versions, s.Version)
	if s.Status == sim.StatusSucceeded || s.Status == sim.StatusFailed {
		close(c.done)
	}
	return true, nil
}

// With a database, every state is in generation_tasks before it is
// published, and the row ends at the last one: a project listed from
// PostgreSQL shows the task, whatever Redis still holds.
func TestStatesCommittedToPostgresBeforePublished(t *testing.T) {
	pg := testenv.Database(t)
	pub := &committed{pg: pg, done: make(chan struct{})}
	s := sim.New(sim.Config{Publisher: pub, DB: pg.Pool, Step: time.Millisecond})
	defer s.Close()
	sp := spec
	sp.TenantID, sp.ProjectID, sp.Fail = testenv.UniqueID("tenant"), testenv.UniqueID("project"), true
	first, err := s.Start(context.Background(), sp)
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-pub.done:
	case <-time.After(30 * time.Second):
		t.Fatal("the walk did not end")
	}
	pub.mu.Lock()
	behind, versions := pub.behind, pub.versions
	pub.mu.Unlock()
	if len(behind) > 0 {
		t.Fatalf("published before committed:\n%s", strings.Join(behind, "\n"))
	}
	var (
		tenant, project, user, status, stage, code string
		kind, prompt, message                      string
		progress                                   int
		version                                    int64
	)
	err = pg.Pool.QueryRow(t.Context(), `SELECT tenant_id, project_id, user_id, status, progress, stage, error_code, version,
		extra->>'kind', extra->>'prompt', extra->>'error_message'
		FROM generation_tasks WHERE id = $1`, first.TaskID).Scan(&tenant, &project, &user, &status, &progress, &stage, &code, &version,
		&kind, &prompt, &message)
	if err != nil {
		t.Fatal(err)
	}
	if tenant != sp.TenantID || project != sp.ProjectID || user != sp.UserID || status != sim.StatusFailed ||
		code != "provider_content_rejected" || stage != "provider_generating" || progress != 51 || version != versions[len(versions)-1] {
		t.Fatalf("row %s %s %s %s %d%% %s %s v%d after v%v", tenant, project, user, status, progress, stage, code, version, versions)
	}
	// The fields without a column are in extra, so a snapshot read back
	// from PostgreSQL still says what failed.
	if kind != sim.TextToVideo || prompt != sp.Prompt || message == "" {
		t.Errorf("extra kind %q, prompt %q, error_message %q; want the walk's", kind, prompt, message)
	}
}

// A state the database refuses is not published: Start fails, and no
// client is shown a task the truth never held.
func TestFailedCommitIsNotPublished(t *testing.T) {
	pg := testenv.Database(t)
	pool, err := pgxpool.New(t.Context(), pg.URL)
	if err != nil {
		t.Fatal(err)
	}
	pool.Close()
	rec := &recorder{}
	s := sim.New(sim.Config{Publisher: rec, DB: pool})
	defer s.Close()
	if _, err := s.Start(context.Background(), spec); err == nil {
		t.Fatal("Start succeeded with a database that refuses")
	}
	if got := rec.states(t); len(got) != 0 {
		t.Fatalf("published %d states the database refused", len(got))
	}
	if n := s.Running(); n != 0 {
		t.Fatalf("%d running after a failed Start", n)
	}
}
