package node

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"time"

	"github.com/pushd/pushd/hub"
	"github.com/pushd/pushd/internal/httperr"
	"github.com/pushd/pushd/snapshot"
)

// inspectLimit bounds the watchers one inspection lists: a task watched by
// 100,000 connections answers with the first thousand and the count of the
// rest, in a response of a few hundred kilobytes.
const inspectLimit = 1000

// inspectTimeout bounds the inspection's read of the task.
const inspectTimeout = 5 * time.Second

// inspection is the body of GET /inspect/tasks/{id} (docs/DEPLOYMENT.md,
// "Did this browser get version N?").
type inspection struct {
	TaskID    string `json:"task_id"`
	TenantID  string `json:"tenant_id"`
	ProjectID string `json:"project_id"`
	UserID    string `json:"user_id"`
	Node      string `json:"node"`
	// Current is the task as this node reads it now.
	Current struct {
		Version int64  `json:"version"`
		Origin  string `json:"origin"`
	} `json:"current"`
	LastHint  *inspectHint     `json:"last_hint"`
	LastRead  *inspectRead     `json:"last_read"`
	Watchers  []inspectWatcher `json:"watchers"`
	Truncated int              `json:"truncated"`
}

type inspectHint struct {
	Version int64 `json:"version"`
	AtMS    int64 `json:"at_ms"`
}

type inspectRead struct {
	Version int64  `json:"version"`
	Source  string `json:"source"`
	Origin  string `json:"origin"`
	AtMS    int64  `json:"at_ms"`
}

type inspectWatcher struct {
	ConnID         string   `json:"conn_id"`
	TenantID       string   `json:"tenant_id"`
	UserID         string   `json:"user_id"`
	Transport      string   `json:"transport"`
	By             []string `json:"by"`
	Allowed        bool     `json:"allowed"`
	SentVersion    int64    `json:"sent_version"`
	SentAtMS       *int64   `json:"sent_at_ms"`
	PendingVersion *int64   `json:"pending_version"`
	Writing        bool     `json:"writing"`
}

// inspectTask answers GET /inspect/tasks/{id} on the admin listener: what
// this node knows of the task's delivery. A task no source has is 404.
func (n *Node) inspectTask(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	ctx, cancel := context.WithTimeout(r.Context(), inspectTimeout)
	defer cancel()
	rep, err := n.hub.InspectTask(ctx, id, inspectLimit)
	switch {
	case errors.Is(err, snapshot.ErrInvalidID): // the sources check an id before any read
		httperr.Write(w, http.StatusBadRequest, httperr.InvalidID, "the task id is not a valid id")
		return
	case errors.Is(err, snapshot.ErrNotFound):
		httperr.Write(w, http.StatusNotFound, httperr.NotFound, "no source has the task "+id)
		return
	case err != nil:
		n.log.Warn("inspection read failed", "task", id, "err", err)
		httperr.Write(w, http.StatusServiceUnavailable, httperr.Unavailable, "the task could not be read")
		return
	}
	s := rep.Snapshot
	body := inspection{TaskID: s.TaskID, TenantID: s.TenantID, ProjectID: s.ProjectID, UserID: s.UserID,
		Node: n.cfg.NodeName, Watchers: make([]inspectWatcher, 0, len(rep.Watchers)), Truncated: rep.Truncated}
	body.Current.Version, body.Current.Origin = s.Version, s.Origin.String()
	if rep.Hint.Version > 0 {
		body.LastHint = &inspectHint{Version: rep.Hint.Version, AtMS: rep.Hint.At.UnixMilli()}
	}
	if rep.Read.Version > 0 {
		body.LastRead = &inspectRead{Version: rep.Read.Version, Source: rep.Read.Source.String(),
			Origin: rep.Read.Origin.String(), AtMS: rep.Read.At.UnixMilli()}
	}
	for _, c := range rep.Watchers {
		body.Watchers = append(body.Watchers, watcherJSON(c))
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	json.NewEncoder(w).Encode(&body)
}

func watcherJSON(c hub.WatcherReport) inspectWatcher {
	out := inspectWatcher{ConnID: c.ConnID, TenantID: c.TenantID, UserID: c.UserID, Transport: c.Transport.String(),
		By: make([]string, 0, 1), Allowed: c.Allowed, SentVersion: c.Sent, Writing: c.Writing}
	if c.ByID {
		out.By = append(out.By, "id")
	}
	if c.ByProject {
		out.By = append(out.By, "project")
	}
	if c.ByUser {
		out.By = append(out.By, "user")
	}
	if !c.SentAt.IsZero() {
		ms := c.SentAt.UnixMilli()
		out.SentAtMS = &ms
	}
	if c.Pending > 0 {
		out.PendingVersion = &c.Pending
	}
	return out
}
