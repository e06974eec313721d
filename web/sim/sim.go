// Package sim is the demo's task simulator: it plays a Task State Service,
// walking made-up video generation tasks through QUEUED, RUNNING,
// PROVIDER_SUBMITTED, POST_PROCESSING and SUCCEEDED or FAILED. Like a real
// service it commits every state to PostgreSQL first, when the node has a
// database, and then publishes it through the node's fanout.Publisher, the
// same path a real service's changes take.
package sim

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	mrand "math/rand/v2"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pushd/pushd/fanout"
	"github.com/pushd/pushd/snapshot"
)

// Errors callers branch on.
var (
	// ErrBusy: the node or the tenant already runs as many simulated tasks
	// as allowed; retry once one has ended.
	ErrBusy = errors.New("sim: too many simulated tasks running")
	// ErrClosed: the simulator was closed.
	ErrClosed = errors.New("sim: closed")
)

// Config configures a Simulator; zero values have defaults.
type Config struct {
	Publisher fanout.Publisher // required
	// DB, when set, is the generation_tasks table's database. Each state
	// is written there before it is published: PostgreSQL is the truth,
	// Redis a cache whose snapshots expire by status, and a project's task
	// list is read from PostgreSQL, so a simulator that wrote Redis only
	// would leave a reloaded page with nothing to list. nil (the embedded
	// mode, or a node with Redis only) publishes only.
	DB *pgxpool.Pool
	// Step is the time between two states of a task; zero means 700ms. A
	// task takes about 14 steps.
	Step time.Duration
	// MaxTasks bounds the simulated tasks running at once on the node (each
	// holds one goroutine); zero means 64.
	MaxTasks int
	// MaxPerTenant bounds them per tenant, so one page cannot take them
	// all; zero means 12.
	MaxPerTenant int
	// PublishTimeout bounds one state's write and publish; zero means 5s.
	// A failed write or publish is logged and the walk goes on: the next
	// state has a higher version and supersedes it, as a real service's
	// would.
	PublishTimeout time.Duration
	Logger         *slog.Logger // nil means slog.Default()
}

// Kinds of simulated tasks.
const (
	TextToVideo  = "text_to_video"
	ImageToVideo = "image_to_video"
)

// Spec describes a task to simulate.
type Spec struct {
	TenantID  string
	ProjectID string
	UserID    string
	Kind      string // TextToVideo or ImageToVideo; empty means TextToVideo
	Prompt    string // shown by the demo page; cut to 200 bytes
	Fail      bool   // end in FAILED at the provider instead of SUCCEEDED
}

// Simulator runs simulated tasks. Close stops them.
type Simulator struct {
	cfg Config
	log *slog.Logger

	ctx    context.Context // canceled by Close; every walk ends on it
	cancel context.CancelFunc
	wg     sync.WaitGroup // one per running walk

	mu       sync.Mutex // guards the fields below
	closed   bool
	running  int
	byTenant map[string]int
}

// New returns a Simulator.
func New(cfg Config) *Simulator {
	if cfg.Step <= 0 {
		cfg.Step = 700 * time.Millisecond
	}
	if cfg.MaxTasks <= 0 {
		cfg.MaxTasks = 64
	}
	if cfg.MaxPerTenant <= 0 {
		cfg.MaxPerTenant = 12
	}
	if cfg.PublishTimeout <= 0 {
		cfg.PublishTimeout = 5 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &Simulator{cfg: cfg, log: cfg.Logger, ctx: ctx, cancel: cancel, byTenant: make(map[string]int)}
}

// Start publishes the first state of a new task (QUEUED, version 1) and
// walks the rest in the background. It returns that first snapshot. The
// spec's ids must be valid (snapshot.ValidID).
func (s *Simulator) Start(ctx context.Context, spec Spec) (*snapshot.Snapshot, error) {
	if spec.Kind == "" {
		spec.Kind = TextToVideo
	}
	if spec.Kind != TextToVideo && spec.Kind != ImageToVideo {
		return nil, fmt.Errorf("sim: unknown kind %q", spec.Kind)
	}
	if !snapshot.ValidID(spec.TenantID) || !snapshot.ValidID(spec.ProjectID) || !snapshot.ValidID(spec.UserID) {
		return nil, fmt.Errorf("sim: %w", snapshot.ErrInvalidID)
	}
	if len(spec.Prompt) > 200 {
		spec.Prompt = spec.Prompt[:200]
	}
	if err := s.reserve(spec.TenantID); err != nil {
		return nil, err
	}
	states := Plan(spec, newTaskID(), mrand.N(3)+2)
	first, err := s.publish(ctx, states[0])
	if err != nil {
		s.release(spec.TenantID)
		return nil, err
	}
	// reserve counted this walk in wg while the simulator was open, so
	// Close waits for it.
	go s.walk(spec.TenantID, states[1:])
	return first, nil
}

// reserve counts a walk against the bounds and in wg.
func (s *Simulator) reserve(tenant string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.closed:
		return ErrClosed
	case s.running >= s.cfg.MaxTasks, s.byTenant[tenant] >= s.cfg.MaxPerTenant:
		return ErrBusy
	}
	s.running++
	s.byTenant[tenant]++
	s.wg.Add(1)
	return nil
}

func (s *Simulator) release(tenant string) {
	s.mu.Lock()
	s.running--
	if s.byTenant[tenant]--; s.byTenant[tenant] <= 0 {
		delete(s.byTenant, tenant)
	}
	s.mu.Unlock()
	s.wg.Done()
}

// Running is how many simulated tasks are running.
func (s *Simulator) Running() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.running
}

// walk publishes the remaining states one step apart; it ends early when
// the simulator closes.
func (s *Simulator) walk(tenant string, states []State) {
	defer s.release(tenant)
	t := time.NewTimer(s.cfg.Step)
	defer t.Stop()
	for _, st := range states {
		select {
		case <-s.ctx.Done():
			return
		case <-t.C:
		}
		if _, err := s.publish(s.ctx, st); err != nil && s.ctx.Err() == nil {
			s.log.Warn("simulated task: publish failed", "task", st.TaskID, "version", st.Version, "err", err)
		}
		t.Reset(s.cfg.Step)
	}
}

func (s *Simulator) publish(ctx context.Context, st State) (*snapshot.Snapshot, error) {
	st.UpdatedAt = time.Now().UnixMilli()
	b, err := json.Marshal(st)
	if err != nil {
		return nil, fmt.Errorf("sim: %w", err)
	}
	snap, err := snapshot.Parse(b)
	if err != nil {
		return nil, fmt.Errorf("sim: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, s.cfg.PublishTimeout)
	defer cancel()
	// Commit, then announce: a state the database refused is not published,
	// so no client is shown a state the truth never held.
	if s.cfg.DB != nil {
		if err := s.save(ctx, st); err != nil {
			return nil, fmt.Errorf("sim: save %s v%d: %w", st.TaskID, st.Version, err)
		}
	}
	if _, err := s.cfg.Publisher.Publish(ctx, snap); err != nil {
		return nil, fmt.Errorf("sim: %w", err)
	}
	return snap, nil
}

// saveSQL writes a state's row unless the row holds the same or a newer
// version, or belongs to another tenant. The demo's own fields (kind,
// prompt, output_url, error_message) go in the row's extra, so a snapshot
// read back from PostgreSQL still shows the video.
const saveSQL = `INSERT INTO generation_tasks (id, tenant_id, project_id, user_id, status, progress, stage,
	provider, model, queue_position, preview_asset_id, output_asset_id, error_code, version, updated_at, extra)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16)
ON CONFLICT (id) DO UPDATE SET status = EXCLUDED.status, progress = EXCLUDED.progress, stage = EXCLUDED.stage,
	provider = EXCLUDED.provider, model = EXCLUDED.model, queue_position = EXCLUDED.queue_position,
	preview_asset_id = EXCLUDED.preview_asset_id, output_asset_id = EXCLUDED.output_asset_id,
	error_code = EXCLUDED.error_code, version = EXCLUDED.version, updated_at = EXCLUDED.updated_at,
	extra = EXCLUDED.extra
WHERE generation_tasks.version < EXCLUDED.version AND generation_tasks.tenant_id = EXCLUDED.tenant_id`

// extra is the part of a state that has no column.
type extra struct {
	Kind         string `json:"kind"`
	Prompt       string `json:"prompt"`
	OutputURL    string `json:"output_url,omitempty"`
	ErrorMessage string `json:"error_message,omitempty"`
}

func (s *Simulator) save(ctx context.Context, st State) error {
	x, err := json.Marshal(extra{st.Kind, st.Prompt, st.OutputURL, st.ErrorMessage})
	if err != nil {
		return err
	}
	_, err = s.cfg.DB.Exec(ctx, saveSQL, st.TaskID, st.TenantID, st.ProjectID, st.UserID, st.Status, st.Progress,
		st.Stage, st.Provider, st.Model, st.QueuePosition, st.PreviewAssetID, st.OutputAssetID, st.ErrorCode,
		st.Version, time.UnixMilli(st.UpdatedAt), string(x))
	return err
}

// Close stops every walk and waits for them. Start fails afterwards. It is
// idempotent.
func (s *Simulator) Close() {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	s.cancel()
	s.wg.Wait()
}

func newTaskID() string {
	b := make([]byte, 6)
	rand.Read(b)
	return "vid_" + hex.EncodeToString(b)
}
