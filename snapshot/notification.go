package snapshot

// Notification says that a task changed. It is a hint, never state: a node
// that hears it re-reads the versioned snapshot. It lives with the model
// because every layer passes it along (bus, stream log, hub) and none of
// them should need a driver to name it.
type Notification struct {
	TenantID   string `json:"-"` // from the channel, never from the payload
	TaskID     string `json:"task_id"`
	Version    int64  `json:"version"`
	ProjectID  string `json:"project_id,omitempty"`
	UserID     string `json:"user_id,omitempty"`
	Status     string `json:"status,omitempty"`
	OccurredAt int64  `json:"occurred_at,omitempty"` // Unix milliseconds
}

// NotificationFor builds the notification announcing s.
func NotificationFor(s *Snapshot) Notification {
	return Notification{
		TenantID: s.TenantID, TaskID: s.TaskID, Version: s.Version,
		ProjectID: s.ProjectID, UserID: s.UserID, Status: s.Status, OccurredAt: s.UpdatedAt,
	}
}
