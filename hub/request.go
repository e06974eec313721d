package hub

import (
	"strconv"

	"github.com/pushd/pushd/internal/httperr"
	"github.com/pushd/pushd/snapshot"
)

// Config returns the hub's settings, defaults filled in: the transports
// read the per-connection ones (MaxIDs, SubscribeTimeout, WriteTimeout,
// SendBuffer) here.
func (h *Hub) Config() Config { return h.cfg }

// CheckIDs checks the ids of one request to watch or unwatch, as every
// transport must before any I/O: at most MaxIDs tasks plus projects, each
// a valid id. It returns the error code and a message for the client, both
// empty when the ids pass.
func (h *Hub) CheckIDs(tasks, projects []string) (code, message string) {
	if len(tasks)+len(projects) > h.cfg.MaxIDs {
		return httperr.TooMany, "at most " + strconv.Itoa(h.cfg.MaxIDs) + " tasks and projects per request"
	}
	for _, id := range tasks {
		if !snapshot.ValidID(id) {
			return httperr.InvalidID, "invalid task id " + httperr.Truncate(strconv.Quote(id), 80)
		}
	}
	for _, id := range projects {
		if !snapshot.ValidID(id) {
			return httperr.InvalidID, "invalid project id " + httperr.Truncate(strconv.Quote(id), 80)
		}
	}
	return "", ""
}
