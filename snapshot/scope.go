package snapshot

// Scope is a project or a user of a tenant whose tasks a subscription
// watches, known and unknown alike: the repair lists what changed in it.
type Scope struct {
	TenantID  string
	ProjectID string // a project scope's project; empty for a user scope
	UserID    string // a user scope's user; empty for a project scope
	// WatchedSince is when the node began watching the scope, Unix ms (0
	// unknown): a scope no listing has marked is first listed from there,
	// less the look back, so that a change committed after the
	// subscription's initial read and before the first round is listed
	// however late that round comes.
	WatchedSince int64
}
