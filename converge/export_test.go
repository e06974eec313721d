package converge

import "context"

// The repair's checks as the store ran them: a request and what it found,
// before a round makes them a hub.Checked.
type (
	CheckRequest      = checkRequest
	Checked           = checkResult
	ScopeCheckRequest = scopeCheckRequest
	ScopesChecked     = scopeCheckResult
)

// SlowCheck is how long a check's PostgreSQL part may take before it is
// reported slow.
const SlowCheck = slowCheck

// MaxScopeRows bounds the rows one listing of one scope reads.
const MaxScopeRows = maxScopeRows

// Check checks a batch of watched tasks with r.
func Check(ctx context.Context, r *Repairer, req CheckRequest) (Checked, error) {
	return r.checkTasks(ctx, req)
}

// CheckScopes lists the changes of a batch of watched scopes with r.
func CheckScopes(ctx context.Context, r *Repairer, req ScopeCheckRequest) (ScopesChecked, error) {
	return r.checkScopes(ctx, req)
}
