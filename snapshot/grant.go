package snapshot

import (
	"errors"
	"fmt"
	"slices"
)

// MaxGrantProjects bounds the projects a grant lists: a token or a session
// that needs more is granted the whole tenant.
const MaxGrantProjects = 100

// AllProjects, alone in a list of projects, grants every project of the
// tenant.
const AllProjects = "*"

// Grant is what a principal may see inside its tenant besides its own
// user's tasks (user_id equal to its subject), which it always sees: the
// tasks of the listed projects, or of every project when All. A nil *Grant
// is the narrow default, the user's own tasks only. A Grant is not
// changed once made: connections share it.
type Grant struct {
	All      bool
	Projects []string // sorted, unique, valid ids; empty with All
}

// ErrBadGrant: a list of projects that is not a grant.
var ErrBadGrant = errors.New("invalid projects")

// ParseGrant makes the grant of a projects claim: nil for none (the
// narrow default), every project for ["*"], else the listed projects, at
// most MaxGrantProjects valid ids.
func ParseGrant(projects []string) (*Grant, error) {
	switch {
	case len(projects) == 0:
		return nil, nil
	case len(projects) == 1 && projects[0] == AllProjects:
		return &Grant{All: true}, nil
	case len(projects) > MaxGrantProjects:
		return nil, fmt.Errorf("%w: %d projects, at most %d (or %q)", ErrBadGrant, len(projects), MaxGrantProjects, AllProjects)
	}
	for _, id := range projects {
		if !ValidID(id) {
			return nil, fmt.Errorf("%w: %q is not a project id (%q grants every project, alone)", ErrBadGrant, id, AllProjects)
		}
	}
	ids := slices.Clone(projects)
	slices.Sort(ids)
	return &Grant{Projects: slices.Compact(ids)}, nil
}

// Claim is the grant as a projects claim: nil for the narrow default.
func (g *Grant) Claim() []string {
	switch {
	case g == nil:
		return nil
	case g.All:
		return []string{AllProjects}
	}
	return g.Projects
}

// Project reports whether g grants every task of project id.
func (g *Grant) Project(id string) bool {
	if g == nil {
		return false
	}
	if g.All {
		return true
	}
	_, ok := slices.BinarySearch(g.Projects, id)
	return ok
}

// Allows reports whether a principal of user userID holding g may see s,
// a task of its own tenant (the tenant is checked apart, first).
func (g *Grant) Allows(userID string, s *Snapshot) bool {
	return (userID != "" && s.UserID == userID) || (g != nil && (g.All || s.ProjectID != "" && g.Project(s.ProjectID)))
}
