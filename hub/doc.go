// Package hub holds a node's connections and what each watches, and delivers
// snapshots to them: one snapshot read per notification however many
// connections watch the task, a conflating outbox per connection (the newest
// version of a task replaces a pending older one), versions that only go up
// per connection and task, and a small pool of writers so that an idle
// connection costs no goroutine of its own. The writers never wait for a
// client: a stalled one's bytes wait on a goroutine of its own (Sink), and
// its outbox keeps conflating meanwhile.
//
// # Goroutines
//
// The hub owns its writers (writeLoop), dispatchers (dispatchLoop), the
// poll loop and the ticker; Close cancels them and waits for all. Fetches
// run on the dispatchers and on the callers of Subscribe; nothing the hub
// starts outlives Close.
//
// # How a connection passes between the writers and its sink
//
// A connection has one writer at a time. An offer that leaves work pending
// marks it scheduled and pushes it on the run queue, once. A writer pops
// it and owns it for one flush: under Conn.writeMu it takes everything
// pending (control events, then tasks, then acks) and calls Sink.Write
// once. If the sink wrote it all, the writer gives the connection back:
// unscheduled, or pushed again if more arrived meanwhile. If the socket
// took only part, the sink keeps the rest, writes it on a goroutine of its
// own, and owns the connection until it calls Conn.Drained; the writer
// moves on. Drained resumes the connection as a writer would, or ends it
// when the backlog failed or timed out. Offers made meanwhile only
// conflate in the outbox: no writer touches a connection its sink owns.
//
// Ending is two steps. The hub marks a connection ending (its pending work
// is dropped) and calls Sink.Closed, which only signals the transport; the
// transport then calls Conn.Close, which removes the connection from the
// indexes and waits out a write in flight under writeMu. After Close
// returns the hub never calls the sink again.
//
// # Lock order
//
// A goroutine that holds more than one lock took them in this order:
//
//	Hub.mu → Conn.writeMu → Conn.mu → (index shard mu | Hub.modeMu | run queue mu | the sink's own locks)
//
// Hub.mu is held across Conn.mu only by Conn.Close. Conn.writeMu is held
// across Sink.Write, and Conn.mu is taken under it to take what is pending.
// The locks in parentheses are leaves: nothing is locked under them, and
// none is held while calling out of the hub. Sink.Closed runs under
// Conn.mu, so a sink never calls into the hub while holding a lock of its
// own, but for the WebSocket's parkMu: a parking reader holds it while it
// answers pings and may report a flood (Conn.Flooded), and it is taken
// with no hub lock held and nothing under a hub lock waits for it. The
// poller's, the read budgets' and the dispatch queue's locks are
// leaves too, taken with no other hub lock held (the dispatch queue's
// before its inner work queue's). A task's note (taskNote: the last hint
// and read of a task watched by id, for InspectTask) takes no lock.
//
// # Counters
//
// Every snapshot the hub lets go of has a reason (Drop) and every
// connection it ends on its own has one (Cut); each reason is one counter
// in Stats.Dropped or Stats.Cuts, and its String is its metric label.
package hub
