package snapshot

// Scope is a project or a user of a tenant whose tasks a subscription
// watches, known and unknown alike: the repair lists what changed in it.
type Scope struct {
	TenantID  string
	ProjectID string // a project scope's project; empty for a user scope
	UserID    string // a user scope's user; empty for a project scope
}
