package admission

import (
	"context"

	"github.com/pushd/pushd/auth"
	"sync"
	"sync/atomic"
)

// Sessions re-validates opaque session tokens; auth/session's Store
// implements it. Presence reports, for each token, what each store holds
// of it now; Revoke makes every node refuse the token from now on.
type Sessions interface {
	Presence(ctx context.Context, tokens []string) (map[string]auth.SessionPresence, error)
	Revoke(ctx context.Context, token string) error
}

// sessionEntry is one session with open connections on this node.
type sessionEntry struct {
	token   string
	refs    int // guarded by sessionSet.mu
	revoked atomic.Bool
	// Where a re-validation found the session once; only checkSessions,
	// one goroutine, reads and writes them. A session that leaves a store
	// it was seen in was logged out there.
	seenRedis, seenDB bool
}

// ended reports whether the session ended by what p found, and records
// where it was found.
func (e *sessionEntry) ended(p auth.SessionPresence) bool {
	switch {
	case p.Ended, e.seenRedis && !p.Redis, e.seenDB && p.DBChecked && !p.DB:
		return true
	case !p.Redis && !p.DB && (p.DBChecked || !e.seenDB):
		return true // in no store that answered, nor ever seen in one that did not
	}
	e.seenRedis = e.seenRedis || p.Redis
	e.seenDB = e.seenDB || p.DB
	return false
}

// sessionSet is the node's live sessions.
type sessionSet struct {
	mu sync.Mutex // guards m and the entries' refs
	m  map[string]*sessionEntry
}

func (s *sessionSet) init() { s.m = make(map[string]*sessionEntry) }

func (s *sessionSet) add(token string) *sessionEntry {
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.m[token]
	if e == nil || e.revoked.Load() {
		e = &sessionEntry{token: token}
		s.m[token] = e
	}
	e.refs++
	return e
}

func (s *sessionSet) remove(e *sessionEntry) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if e.refs--; e.refs <= 0 && s.m[e.token] == e {
		delete(s.m, e.token)
	}
}

// sessionBatch bounds the tokens one re-validation round trip checks.
const sessionBatch = 500

// checkSessions re-validates every live session in batches and revokes
// those that ended in either store (deleted or expired in Redis or in the
// database): the hub then ends their connections with the token-expired
// close reason, and Revoke makes every node refuse the token. A store
// that does not answer revokes nothing by what it would have said.
func (c *Controller) checkSessions() {
	if c.cfg.Sessions == nil {
		return
	}
	c.sessions.mu.Lock()
	entries := make([]*sessionEntry, 0, len(c.sessions.m))
	for _, e := range c.sessions.m {
		entries = append(entries, e)
	}
	c.sessions.mu.Unlock()
	for len(entries) > 0 {
		n := min(len(entries), sessionBatch)
		batch := entries[:n]
		entries = entries[n:]
		tokens := make([]string, n)
		for i, e := range batch {
			tokens[i] = e.token
		}
		ctx, cancel := context.WithTimeout(context.Background(), c.bgTimeout())
		found, err := c.cfg.Sessions.Presence(ctx, tokens)
		if err != nil {
			cancel()
			c.sessionsLost.Fail("session re-validation failed; sessions kept until it answers", err)
			return
		}
		c.sessionsLost.OK("session re-validation answers again")
		for _, e := range batch {
			p, ok := found[e.token]
			if !ok || e.revoked.Load() || !e.ended(p) {
				continue
			}
			if !e.revoked.Swap(true) {
				c.stats.sessionsClosed.Add(1)
			}
			if err := c.cfg.Sessions.Revoke(ctx, e.token); err != nil {
				c.log.Warn("session revoked here, but not for the fleet", "err", err)
			}
		}
		cancel()
	}
	c.stats.sessionChecks.Add(1)
}
