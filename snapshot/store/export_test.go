package store

// OnDBReadRegistered has f called each time a PostgreSQL read has joined the
// reads running of its ids and registered its own query for the rest, before
// it waits for either. Set it before the Store's first read.
func OnDBReadRegistered(s *Store, f func()) { s.registered = f }

// SlowCheck is how long a check's PostgreSQL part may take before it is
// reported slow.
const SlowCheck = slowCheck

// AsksPending is how many callers' Redis reads are queued or in the MGET
// in flight.
func AsksPending(s *Store) int {
	s.asks.mu.Lock()
	defer s.asks.mu.Unlock()
	return len(s.asks.queue) + s.asks.reading
}
