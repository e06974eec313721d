package store

// OnDBReadRegistered has f called each time a PostgreSQL read has joined the
// reads running of its ids and registered its own query for the rest, before
// it waits for either. Set it before the Store's first read.
func OnDBReadRegistered(s *Store, f func()) { s.registered = f }

// OnRedisMissed has f called each time a read (a Get's fetch or a GetMany
// batch) missed tasks in Redis, before it reads them from PostgreSQL. Set
// it before the Store's first read.
func OnRedisMissed(s *Store, f func()) { s.missedRedis = f }

// AsksPending is how many callers' Redis reads are queued or in the MGET
// in flight.
func AsksPending(s *Store) int {
	s.asks.mu.Lock()
	defer s.asks.mu.Unlock()
	return len(s.asks.queue) + s.asks.reading
}

// CachedAbsent reports whether the in-process negative cache holds taskID,
// without I/O.
func CachedAbsent(s *Store, taskID string) bool {
	_, ok := s.missing.get(taskID)
	return ok
}
