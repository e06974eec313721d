package hub

import "github.com/pushd/pushd/snapshot"

// Kind says what an Event carries.
type Kind uint8

// The kinds of events a transport writes.
const (
	KindTask      Kind = iota + 1 // Snapshot
	KindMode                      // Mode, Reason
	KindError                     // Code, Message, TaskID or ProjectID
	KindHeartbeat                 // nothing; keeps idle connections alive
	KindReconnect                 // AfterMS: reconnect after this delay; the connection closes next
	KindHello                     // ConnID, Node, Mode, Reason, HeartbeatMS: the first event of every connection
	KindAck                       // AckID, Rejected: written after the snapshots the request queued
	KindSync                      // Cursor: the connection's state is complete as of this resume cursor
)

// Event is one thing to write to a client. Events are values built by the
// hub and read by one transport writer; a task event's Snapshot is shared by
// every connection that receives it and must not be modified.
type Event struct {
	Kind     Kind
	Snapshot *snapshot.Snapshot
	// Cursor, on a task or sync event, is the resume position (Stream's)
	// the client holds everything up to once it has this event; "" means
	// the transport's own cursor. Only connections that asked for cursors
	// (Subscription.Cursors) get one.
	Cursor string
	// Patch, on a task event to a connection that asked for deltas
	// (Principal.Deltas), turns the version the connection last sent the
	// client into Snapshot; nil when there is none, and the whole
	// snapshot must go.
	Patch     *snapshot.Patch
	Mode      string
	Reason    string
	Code      string
	Message   string
	TaskID    string
	ProjectID string
	AfterMS   int
	// RetryAfter (whole seconds, rounded up) and RetryAfterMS, on a
	// rate_limit_exceeded error, are when what was refused may be asked
	// for again.
	RetryAfter   int64
	RetryAfterMS int64

	ConnID      string
	Node        string
	HeartbeatMS int64
	AckID       int64
	Rejected    []Rejection

	news news // a task event's origin, for the hub's histograms after the write
	// base is the snapshot the connection last sent of the task, from
	// which flush makes Patch outside the connection's lock.
	base *snapshot.Snapshot
}

// Modes a node can be in.
const (
	ModePush    = "push"    // notifications arrive over the bus
	ModePolling = "polling" // the bus is down; watched tasks are re-read on a timer
)

// Error codes of refused subscriptions and closed connections.
const (
	CodeNotFound          = "not_found"
	CodeInvalidID         = "invalid_id"
	CodeTooMany           = "too_many_subscriptions"
	CodeUnavailable       = "unavailable"
	CodeTokenExpired      = "token_expired"
	CodeShuttingDown      = "shutting_down"
	CodeRateLimitExceeded = "rate_limit_exceeded" // the user's read budget is spent; RetryAfter and RetryAfterMS say for how long
)

// CloseReason tells a transport why the hub closed a connection, so it can
// pick the close code its protocol has for it.
type CloseReason uint8

// Reasons the hub closes a connection.
const (
	CloseNormal       CloseReason = iota // the hub is closing
	CloseWriteFailed                     // a write failed or timed out: a slow or gone client
	CloseTokenExpired                    // the token's exp passed
	CloseDraining                        // the node is shutting down; the client was told to reconnect
	CloseTokenRefused                    // a token the client sent on the connection was refused
	CloseFlooded                         // the client sent control frames (pings, pongs) past its budget
)

// Sink writes to one client. The hub calls Write from one goroutine at a
// time, never concurrently, and never after the transport's Conn.Close has
// returned.
type Sink interface {
	// Bind is called once by Hub.Open with the connection, before anything
	// is written to the sink: the Conn a queued write reports Drained to.
	Bind(c *Conn)
	// Write writes every event and flushes once, without waiting for a
	// client that reads slowly: the hub's writers are shared, and one
	// stalled client must not hold one. What the socket cannot take at
	// once the sink keeps and writes on a goroutine of its own, reporting
	// queued; it then calls Conn.Drained exactly once, when that is written
	// or has failed, and the hub writes nothing more to it until then. The
	// sink bounds a backlog with the transport's write timeout. An error
	// closes the connection.
	Write(events []Event) (queued bool, err error)
	// Closed is called once when the hub ends the connection. It must not
	// block: it signals the transport, which then calls Conn.Close.
	Closed(reason CloseReason)
}
