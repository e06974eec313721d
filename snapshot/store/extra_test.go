package store_test

import (
	"errors"
	"log/slog"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pushd/pushd/internal/testenv"
	"github.com/pushd/pushd/snapshot"
	"github.com/pushd/pushd/snapshot/store"
)

// insertExtra stores a task row of tenant t1, project p1 whose extra
// column is extra (JSON) and whose stage is stage.
func (e env) insertExtra(t *testing.T, id, stage, extra string) error {
	t.Helper()
	_, err := e.pg.Pool.Exec(testenv.Context(t), `INSERT INTO generation_tasks
		(id, tenant_id, project_id, user_id, status, progress, stage, version, updated_at, extra)
		VALUES ($1, 't1', 'p1', 'u1', 'SUCCEEDED', 100, $2, 7, to_timestamp(1710000000), $3)`, id, stage, extra)
	return err
}

// The fields a Task State Service keeps in the row's extra column reach
// the snapshot pushd builds from the row, after the columns, on every
// read of rows: one task, many, a project's list; and the write-back to
// Redis keeps them, so the video's output_url survives Redis losing the
// snapshot.
func TestStoreRowExtraIsInTheSnapshot(t *testing.T) {
	t.Parallel()
	e := newEnv(t, store.Config{})
	id := testenv.UniqueID("task")
	if err := e.insertExtra(t, id, "done", `{"output_url": "https://cdn.example/v.mp4", "thumb": {"w": 640, "h": 360}}`); err != nil {
		t.Fatal(err)
	}
	// jsonb keeps an object's members shortest name first.
	want := `{"task_id":"` + id + `","tenant_id":"t1","project_id":"p1","user_id":"u1",` +
		`"status":"SUCCEEDED","progress":100,"stage":"done","provider":null,"model":null,"queue_position":null,` +
		`"preview_asset_id":null,"output_asset_id":null,"error_code":null,"version":7,"updated_at":1710000000000,` +
		`"thumb":{"h":360,"w":640},"output_url":"https://cdn.example/v.mp4"}`

	got := mustGet(t, e.store, id, 0)
	if got.Origin != snapshot.OriginPostgres || string(got.JSON()) != want {
		t.Fatalf("Get from %v:\n got %s\nwant %s", got.Origin, got.JSON(), want)
	}
	stored, err := e.r.Client.Get(testenv.Context(t), e.r.Names.Snapshot(id)).Result()
	if err != nil || stored != want {
		t.Errorf("written back to Redis as %q, %v; want the snapshot with its extra", stored, err)
	}

	other := newStore(t, store.Config{DB: e.pg.Pool, Names: e.r.Names})
	many, err := other.GetMany(testenv.Context(t), []string{id})
	if err != nil || len(many) != 1 || many[id] == nil || string(many[id].JSON()) != want {
		t.Errorf("GetMany = %v, %v; want the snapshot with its extra", many, err)
	}
	list, err := other.ListProject(testenv.Context(t), "t1", "p1")
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, s := range list {
		found = found || (s.TaskID == id && string(s.JSON()) == want)
	}
	if !found {
		t.Errorf("ListProject lacks %s with its extra", id)
	}
}

// The column's check refuses, at the writer's commit, an extra no snapshot
// could carry.
func TestExtraCheckRefusesWhatNoSnapshotCarries(t *testing.T) {
	t.Parallel()
	e := newEnv(t, store.Config{})
	for name, extra := range map[string]string{
		"an array":            `[1, 2]`,
		"a string":            `"x"`,
		"a column's name":     `{"version": 99}`,
		"the tenant's name":   `{"tenant_id": "t2"}`,
		"more than 48 KiB":    `{"big": "` + strings.Repeat("x", 49152) + `"}`,
		"null, not an object": `null`,
	} {
		err := e.insertExtra(t, testenv.UniqueID("task"), "", extra)
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || (pgErr.Code != "23514" && pgErr.Code != "23502") {
			t.Errorf("%s: insert err %v, want a check (23514) or not-null (23502) violation", name, err)
		}
	}
	if err := e.insertExtra(t, testenv.UniqueID("task"), "", `{"big": "`+strings.Repeat("x", 40000)+`"}`); err != nil {
		t.Errorf("40,000 bytes of extra refused: %v", err)
	}
}

// A row whose extra would take the document past its 64 KiB (a long
// column beside a large extra) is still served, with its columns alone,
// and logged: the task stays on screen.
func TestStoreRowWithoutRoomForExtraKeepsItsColumns(t *testing.T) {
	t.Parallel()
	var logs testenv.LogBuffer
	e := newEnv(t, store.Config{Logger: slog.New(slog.NewJSONHandler(&logs, nil))})
	id := testenv.UniqueID("task")
	if err := e.insertExtra(t, id, strings.Repeat("s", 20000), `{"big": "`+strings.Repeat("x", 48000)+`"}`); err != nil {
		t.Fatal(err)
	}
	got := mustGet(t, e.store, id, 0)
	if got.Version != 7 || strings.Contains(string(got.JSON()), `"big"`) || len(got.JSON()) > snapshot.MaxSize {
		t.Errorf("got version %d, %d bytes; want version 7 without the extra", got.Version, len(got.JSON()))
	}
	if !strings.Contains(logs.String(), "extra left out") || !strings.Contains(logs.String(), id) {
		t.Errorf("the extra left out is not logged with the task:\n%s", logs.String())
	}
}

// A database without the extra column (its migration not run yet) is read
// as before: a node upgraded before its database keeps serving.
func TestStoreReadsATableWithoutExtra(t *testing.T) {
	t.Parallel()
	e := newEnv(t, store.Config{})
	url := e.pg.BareSchema(t, "0001_generation_tasks.sql")
	pool, err := pgxpool.New(testenv.Context(t), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	id := testenv.UniqueID("task")
	if _, err := pool.Exec(testenv.Context(t), `INSERT INTO generation_tasks (id, tenant_id, status, version, updated_at)
		VALUES ($1, 't1', 'RUNNING', 3, to_timestamp(1710000000))`, id); err != nil {
		t.Fatal(err)
	}
	s := newStore(t, store.Config{DB: pool, Names: e.r.Names})
	got := mustGet(t, s, id, 0)
	if got.Version != 3 || !strings.HasSuffix(string(got.JSON()), `"version":3,"updated_at":1710000000000}`) {
		t.Errorf("Get = %s, want the row's columns", got.JSON())
	}
}
