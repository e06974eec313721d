package admission

import (
	"context"
	"sync"
	"sync/atomic"
)

// Sessions re-validates opaque session tokens; auth/session's Store
// implements it. Valid reports, for each token, whether its session still
// exists; a token missing from the answer is taken as still valid.
type Sessions interface {
	Valid(ctx context.Context, tokens []string) (map[string]bool, error)
}

// sessionEntry is one session with open connections on this node.
type sessionEntry struct {
	token   string
	refs    int // guarded by sessionSet.mu
	revoked atomic.Bool
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
// those the store no longer has: the hub then ends their connections with
// the token-expired close reason. A failing store revokes nothing.
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
		valid, err := c.cfg.Sessions.Valid(ctx, tokens)
		cancel()
		if err != nil {
			c.sessionsLost.Fail("session re-validation failed; sessions kept until it answers", err)
			return
		}
		c.sessionsLost.OK("session re-validation answers again")
		for _, e := range batch {
			if ok, known := valid[e.token]; known && !ok && !e.revoked.Swap(true) {
				c.stats.sessionsClosed.Add(1)
			}
		}
	}
}
