// Package session resolves opaque session tokens to the principal they
// name: the control Redis first, then PostgreSQL, whose answer is written
// back. It is apart from auth so that verifying a JWT needs no driver;
// auth.Verifier takes any auth.SessionResolver, and this Store is the one a
// node uses.
package session

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	lru "github.com/hashicorp/golang-lru/v2"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"golang.org/x/sync/semaphore"
	"golang.org/x/sync/singleflight"

	"github.com/pushd/pushd/auth"
	"github.com/pushd/pushd/internal/episode"
	"github.com/pushd/pushd/internal/flagval"
	"github.com/pushd/pushd/snapshot"
)

// Config configures a Store. Redis is required.
type Config struct {
	// Redis holds session:<token> (JSON {"tenant_id","user_id","plan",
	// "expires_at"}, expires_at in Unix milliseconds and optional), with the
	// session's lifetime as its TTL. A stream ends at expires_at; without
	// one it ends when re-validation finds the session gone.
	Redis redis.UniversalClient
	// DB, when set, is read on a Redis miss: table sessions (token,
	// tenant_id, user_id, plan, projects, expires_at). Nil means Redis is
	// the only store.
	//
	// A session either store holds that cannot become a principal (a
	// tenant_id or user_id that is no valid id, a NULL or invalid id in
	// projects, a Redis document that is no session) is malformed: its
	// token is refused as invalid, never as unavailable, and it is logged
	// at warn once per NegativeTTL, named by SessionID. An expires_at of
	// infinity, as NULL, names no expiry.
	DB *pgxpool.Pool
	// Prefix is prepended to the Redis keys (keys.Names.Prefix).
	Prefix string
	// CacheTTL bounds how long a session read from the database is kept in
	// Redis, marked as a copy (never past its expiry): a session deleted
	// from the database is refused by every node's new requests within it.
	// Zero means 10s.
	CacheTTL time.Duration
	// TombstoneTTL is how long a revoked session's tombstone stays in
	// Redis, refusing the token on every node whatever the other store
	// still holds; zero means 24h.
	TombstoneTTL time.Duration
	// Timeout bounds each lookup; zero means 2s.
	Timeout time.Duration
	// NegativeTTL is how long a token the database does not know, or
	// holds a malformed row of, is remembered, in process, so that its
	// repeats cost no query; Redis is still asked, so a session written
	// there meanwhile is found. It is also how long a malformed session
	// goes unlogged after its warning. Zero means 10s; negative disables
	// both. NegativeEntries bounds the tokens remembered, the least
	// recently refused forgotten first; zero means 65536.
	NegativeTTL     time.Duration
	NegativeEntries int
	// MaxDBQueries caps the lookups in the database at once; zero means 4.
	// A lookup that finds them all taken waits DBQueueWait (zero means
	// 500ms), then fails with auth.ErrUnavailable rather than queue behind a
	// slow or flooded database.
	MaxDBQueries int
	DBQueueWait  time.Duration
	// Logger receives the failures of the database's lookups, one episode
	// at a time (a warning when they start, a summary while they last);
	// nil means slog.Default().
	Logger *slog.Logger
}

// Store resolves opaque session tokens: Redis first, then PostgreSQL,
// whose answer is written back to Redis; concurrent lookups of one token
// share one. It is safe for concurrent use.
type Store struct {
	cfg Config
	sf  singleflight.Group
	// unknown maps the tokens the database lately did not know to when
	// that stops being trusted. In process rather than in Redis: made-up
	// tokens would otherwise each cost a Redis write and memory there, and
	// what it saves, database queries, is bounded per node anyway. Nil
	// when disabled.
	unknown *lru.Cache[string, time.Time]
	// warned maps the tokens of malformed sessions lately logged to when
	// they may be logged again, so that a client repeating one costs one
	// line per NegativeTTL. Nil when NegativeTTL disables it.
	warned  *lru.Cache[string, time.Time]
	dbSlots *semaphore.Weighted
	queries atomic.Int64 // database queries sent, lookups and re-checks
	// dbFailures logs the lookups the database failed: their tokens are
	// answered 503, and nothing else would say why.
	dbFailures *episode.Logger
}

// Queries is how many database queries the store has sent: a lookup per
// token Redis lacks, and one per re-check batch.

// DefaultMaxDBQueries is Config.MaxDBQueries's default.
const DefaultMaxDBQueries = 4

func (s *Store) Queries() int64 { return s.queries.Load() }

// RegisterFlags defines on fs a flag for each setting of c an operator
// sets, bound to its field, with the field's value as its default: call it
// on a Config with its defaults (DefaultConfig or WithDefaults).
func (c *Config) RegisterFlags(fs *flag.FlagSet) {
	flagval.Duration(fs, &c.NegativeTTL, "session-negative-ttl", "how long this node remembers a session token PostgreSQL does not know, so its repeats cost no query (Redis is still asked)")
	fs.IntVar(&c.NegativeEntries, "session-negative-entries", c.NegativeEntries, "unknown session tokens this node remembers; past it the least recently refused are forgotten")
	fs.IntVar(&c.MaxDBQueries, "session-db-queries", c.MaxDBQueries, "session lookups this node runs in PostgreSQL at once (besides the snapshot reads' 8); one more waits --session-db-wait, then gets 503")
	flagval.Duration(fs, &c.DBQueueWait, "session-db-wait", "how long a session lookup waits for one of --session-db-queries before it is answered 503 unavailable")
}

// WithDefaults returns c with each zero setting that has a default set to
// it; it is the one place those defaults are written.
func (c Config) WithDefaults() Config {
	if c.CacheTTL <= 0 {
		c.CacheTTL = 10 * time.Second
	}
	if c.TombstoneTTL <= 0 {
		c.TombstoneTTL = 24 * time.Hour
	}
	if c.Timeout <= 0 {
		c.Timeout = 2 * time.Second
	}
	if c.NegativeTTL == 0 {
		c.NegativeTTL = 10 * time.Second
	}
	if c.NegativeEntries <= 0 {
		c.NegativeEntries = 1 << 16
	}
	if c.MaxDBQueries <= 0 {
		c.MaxDBQueries = DefaultMaxDBQueries
	}
	if c.DBQueueWait <= 0 {
		c.DBQueueWait = 500 * time.Millisecond
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

// New returns a session resolver.
func New(cfg Config) *Store {
	cfg = cfg.WithDefaults()
	s := &Store{cfg: cfg, dbSlots: semaphore.NewWeighted(int64(cfg.MaxDBQueries)),
		dbFailures: episode.New(cfg.Logger, "session lookups in postgres still failing")}
	if cfg.NegativeTTL > 0 {
		s.unknown, _ = lru.New[string, time.Time](cfg.NegativeEntries) // errs only on a size <= 0
		s.warned, _ = lru.New[string, time.Time](cfg.NegativeEntries)
	}
	return s
}

// record is the JSON of session:<token>.
type record struct {
	TenantID string `json:"tenant_id"`
	UserID   string `json:"user_id"`
	Plan     string `json:"plan,omitempty"`
	// Projects is the session's grant inside its tenant, as a token's
	// projects claim: none for the user's own tasks only, ["*"] for every
	// project.
	Projects []string `json:"projects,omitempty"`
	// Copy marks a node's copy of a database row (the write-back), which
	// is not a record of the login service's own.
	Copy bool `json:"pushd_copy,omitempty"`
	// Revoked marks a tombstone: a node found the session ended in one
	// store and refuses it in every one.
	Revoked bool `json:"revoked,omitempty"`
	// ExpiresAt is Unix milliseconds; zero means the session names none.
	// The write-back keeps it, so a session read from Redis ends its
	// streams when the one read from PostgreSQL would.
	ExpiresAt int64 `json:"expires_at,omitempty"`
}

func (s *Store) key(token string) string { return s.cfg.Prefix + "session:" + token }

// validToken bounds what is looked up: the token becomes a key.
func validToken(token string) bool {
	if len(token) < 16 || len(token) > 256 {
		return false
	}
	for i := 0; i < len(token); i++ {
		c := token[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
			return false
		}
	}
	return true
}

// Resolve returns the principal of a session token. The error wraps
// auth.ErrInvalidToken for an unknown, expired or malformed token and
// auth.ErrUnavailable when no store answered.
func (s *Store) Resolve(ctx context.Context, token string) (auth.Principal, error) {
	if !validToken(token) {
		return auth.Principal{}, auth.Invalid("malformed session token", nil)
	}
	v, err, _ := s.sf.Do(token, func() (any, error) {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.cfg.Timeout)
		defer cancel()
		return s.lookup(ctx, token)
	})
	if err != nil {
		return auth.Principal{}, err
	}
	return v.(auth.Principal), nil
}

func (s *Store) lookup(ctx context.Context, token string) (auth.Principal, error) {
	raw, rerr := s.cfg.Redis.Get(ctx, s.key(token)).Bytes()
	if rerr == nil {
		var sess record
		if err := json.Unmarshal(raw, &sess); err != nil {
			return auth.Principal{}, s.malformed(token, "redis", "the document is not a session: "+err.Error())
		}
		if sess.Revoked {
			return auth.Principal{}, auth.Invalid("revoked session", nil)
		}
		var expires time.Time
		if sess.ExpiresAt != 0 {
			if expires = time.UnixMilli(sess.ExpiresAt); !time.Now().Before(expires) {
				return auth.Principal{}, auth.Invalid("unknown session", nil) // expired, as PostgreSQL would say
			}
		}
		p, why := principalOf(token, sess, expires)
		if why != "" {
			return auth.Principal{}, s.malformed(token, "redis", why)
		}
		return p, nil
	}
	if s.cfg.DB == nil {
		if errors.Is(rerr, redis.Nil) {
			return auth.Principal{}, auth.Invalid("unknown session", nil)
		}
		return auth.Principal{}, fmt.Errorf("%w: %w", auth.ErrUnavailable, rerr)
	}
	if s.knownUnknown(token) {
		return auth.Principal{}, auth.Invalid("unknown session", nil)
	}
	sess, exp, why, err := s.query(ctx, token)
	switch {
	case err != nil && !errors.Is(err, pgx.ErrNoRows) && ctx.Err() == nil:
		s.dbFailures.Fail("session lookup in postgres failed; its token is answered 503 unavailable", err)
	case ctx.Err() == nil:
		s.dbFailures.OK("session lookups in postgres answer again")
	}
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		s.rememberUnknown(token)
		return auth.Principal{}, auth.Invalid("unknown session", nil)
	case err != nil:
		return auth.Principal{}, fmt.Errorf("%w: %w", auth.ErrUnavailable, err)
	}
	var expires time.Time
	ttl := s.cfg.CacheTTL
	if !exp.IsZero() {
		expires = exp
		ttl = min(ttl, time.Until(expires))
		// Truncated to the millisecond: the copy never outlives the row.
		sess.ExpiresAt = expires.UnixMilli()
	}
	p, pwhy := principalOf(token, sess, expires)
	if why == "" {
		why = pwhy
	}
	if why != "" {
		// Remembered as an unknown token is: the row is the database's
		// answer, and its repeats need not ask again.
		s.rememberUnknown(token)
		return auth.Principal{}, s.malformed(token, "postgres", why)
	}
	// Written back only when Redis answered the miss: a Redis that failed
	// is left alone, and the next lookup tries it again.
	if errors.Is(rerr, redis.Nil) && ttl > 0 {
		sess.Copy = true
		if b, err := json.Marshal(sess); err == nil {
			s.cfg.Redis.Set(ctx, s.key(token), b, ttl)
		}
	}
	return p, nil
}

// rememberUnknown spares token's repeats a query for NegativeTTL: the
// database did not know it, or holds a malformed row of it.
func (s *Store) rememberUnknown(token string) {
	if s.unknown != nil {
		s.unknown.Add(token, time.Now().Add(s.cfg.NegativeTTL))
	}
}

// knownUnknown reports whether the database lately did not know token.
func (s *Store) knownUnknown(token string) bool {
	if s.unknown == nil {
		return false
	}
	until, ok := s.unknown.Get(token)
	if ok && time.Now().After(until) {
		s.unknown.Remove(token)
		return false
	}
	return ok
}

// query reads token's live session from the database, holding one of
// MaxDBQueries slots. Every column is read as nullable, so that a value no
// session may have is a malformed row (why says what), not a failed query
// answered 503: a NULL in projects, or in a column the schema declares
// NOT NULL. exp is zero for a session that names no expiry (NULL or
// infinity).
func (s *Store) query(ctx context.Context, token string) (sess record, exp time.Time, why string, err error) {
	wctx, cancel := context.WithTimeout(ctx, s.cfg.DBQueueWait)
	err = s.dbSlots.Acquire(wctx, 1)
	cancel()
	if err != nil {
		return sess, exp, "", fmt.Errorf("%d session lookups in flight for %v", s.cfg.MaxDBQueries, s.cfg.DBQueueWait)
	}
	defer s.dbSlots.Release(1)
	s.queries.Add(1)
	var (
		tenant, user, plan pgtype.Text
		projects           []pgtype.Text
		expires            pgtype.Timestamptz
	)
	err = s.cfg.DB.QueryRow(ctx, `SELECT tenant_id, user_id, plan, projects, expires_at FROM sessions
		WHERE token = $1 AND (expires_at IS NULL OR expires_at > now())`, token).Scan(&tenant, &user, &plan, &projects, &expires)
	if err != nil {
		return sess, exp, "", err
	}
	sess.TenantID, sess.UserID, sess.Plan = tenant.String, user.String, plan.String
	for _, p := range projects {
		if !p.Valid {
			why = "projects holds NULL"
		}
		sess.Projects = append(sess.Projects, p.String)
	}
	if !tenant.Valid || !user.Valid {
		why = "tenant_id or user_id is NULL"
	}
	// -infinity never passes the WHERE; infinity is as NULL, no expiry.
	if expires.Valid && expires.InfinityModifier == pgtype.Finite {
		exp = expires.Time
	}
	return sess, exp, why, nil
}

// principalOf is the principal of a session, or why it cannot be one.
func principalOf(token string, sess record, expires time.Time) (auth.Principal, string) {
	if !snapshot.ValidID(sess.TenantID) {
		return auth.Principal{}, "tenant_id is no valid id"
	}
	if !snapshot.ValidID(sess.UserID) {
		return auth.Principal{}, "user_id is no valid id"
	}
	grant, err := snapshot.ParseGrant(sess.Projects)
	if err != nil {
		return auth.Principal{}, "projects: " + err.Error()
	}
	p := auth.Principal{TenantID: sess.TenantID, UserID: sess.UserID, ExpiresAt: expires, EndsAt: expires, Session: token, Grant: grant}
	// A plan only selects limits; one that is no plain name is ignored, as
	// a token's plan claim is.
	if snapshot.ValidID(sess.Plan) {
		p.Plan = sess.Plan
	}
	return p, ""
}

// malformed logs a session of store that cannot become a principal, once
// per NegativeTTL for its token, and returns the invalid token error it is
// answered with: the client's token is no good (401), and a retry would
// find the same session (never 503).
func (s *Store) malformed(token, store, why string) error {
	now := time.Now()
	if s.warned != nil {
		if until, ok := s.warned.Get(token); ok && now.Before(until) {
			return auth.Invalid("malformed session", nil)
		}
		s.warned.Add(token, now.Add(s.cfg.NegativeTTL))
	}
	s.cfg.Logger.Warn("malformed session refused as an invalid token; fix or delete it in its store",
		"store", store, "session", SessionID(token), "reason", why)
	return auth.Invalid("malformed session", nil)
}

// SessionID names a session in logs: the first 6 bytes of the SHA-256 of
// its token, in hex. The token is the session's key in both stores and a
// credential, so it is never logged itself; an operator finds the row with
// left(encode(sha256(token::bytea), 'hex'), 12) in PostgreSQL.
func SessionID(token string) string {
	sum := sha256.Sum256([]byte(token))
	return hex.EncodeToString(sum[:6])
}

// Presence reports what each store holds of each token now: one pipelined
// GET per token in Redis (which Redis Cluster can route), and one query of
// the database for all of them, in one of the bounded lookup slots. A
// Redis that does not answer fails it; a database that does not answer
// leaves DBChecked false.
func (s *Store) Presence(ctx context.Context, tokens []string) (map[string]auth.SessionPresence, error) {
	out := make(map[string]auth.SessionPresence, len(tokens))
	pipe := s.cfg.Redis.Pipeline()
	cmds := make([]*redis.StringCmd, len(tokens))
	for i, t := range tokens {
		cmds[i] = pipe.Get(ctx, s.key(t))
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return nil, fmt.Errorf("sessions: %w", err)
	}
	now := time.Now()
	for i, t := range tokens {
		var p auth.SessionPresence
		var sess record
		if raw, err := cmds[i].Bytes(); err == nil && json.Unmarshal(raw, &sess) == nil {
			switch {
			case sess.Revoked, sess.ExpiresAt != 0 && !now.Before(time.UnixMilli(sess.ExpiresAt)):
				p.Ended = true
			case !sess.Copy:
				p.Redis = true
			}
		}
		out[t] = p
	}
	if s.cfg.DB == nil {
		return out, nil
	}
	rows, err := s.queryPresence(ctx, tokens)
	if err != nil {
		return out, nil // DBChecked stays false: nothing is revoked by what it would have said
	}
	for t, expired := range rows {
		p := out[t]
		p.DB, p.Ended = !expired, p.Ended || expired
		out[t] = p
	}
	for _, t := range tokens {
		p := out[t]
		p.DBChecked = true
		out[t] = p
	}
	return out, nil
}

// queryPresence reads the rows of tokens, each with whether it expired,
// holding one of MaxDBQueries slots.
func (s *Store) queryPresence(ctx context.Context, tokens []string) (map[string]bool, error) {
	wctx, cancel := context.WithTimeout(ctx, s.cfg.DBQueueWait)
	err := s.dbSlots.Acquire(wctx, 1)
	cancel()
	if err != nil {
		return nil, fmt.Errorf("%d session lookups in flight for %v", s.cfg.MaxDBQueries, s.cfg.DBQueueWait)
	}
	defer s.dbSlots.Release(1)
	s.queries.Add(1)
	rows, err := s.cfg.DB.Query(ctx, `SELECT token, expires_at IS NOT NULL AND expires_at <= now() FROM sessions WHERE token = ANY($1)`, tokens)
	if err != nil {
		return nil, fmt.Errorf("sessions: %w", err)
	}
	out := make(map[string]bool, len(tokens))
	var token string
	var expired bool
	_, err = pgx.ForEachRow(rows, []any{&token, &expired}, func() error {
		out[token] = expired
		return nil
	})
	return out, err
}

// tombstone is the record Revoke writes, as documented: it names no
// tenant or user, which a marshalled record would as empty strings.
var tombstone = []byte(`{"revoked":true}`)

// Revoke writes the token's tombstone in Redis: every node refuses the
// token from now on, whatever the database still holds, for TombstoneTTL.
func (s *Store) Revoke(ctx context.Context, token string) error {
	if err := s.cfg.Redis.Set(ctx, s.key(token), tombstone, s.cfg.TombstoneTTL).Err(); err != nil {
		return fmt.Errorf("sessions: revoke: %w", err)
	}
	return nil
}
