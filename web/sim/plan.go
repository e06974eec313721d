package sim

// State is one snapshot of a simulated task, in the shape of
// docs/DESIGN.md, "Snapshot document", plus fields of the demo's own
// (kind, prompt, output_url, error_message), which pushd forwards untouched
// like any unknown field.
type State struct {
	TaskID         string  `json:"task_id"`
	TenantID       string  `json:"tenant_id"`
	ProjectID      string  `json:"project_id"`
	UserID         string  `json:"user_id"`
	Status         string  `json:"status"`
	Progress       int     `json:"progress"`
	Stage          string  `json:"stage"`
	Provider       string  `json:"provider"`
	Model          string  `json:"model"`
	QueuePosition  *int    `json:"queue_position"`
	PreviewAssetID *string `json:"preview_asset_id"`
	OutputAssetID  *string `json:"output_asset_id"`
	ErrorCode      *string `json:"error_code"`
	Version        int64   `json:"version"`
	UpdatedAt      int64   `json:"updated_at"`

	Kind         string `json:"kind"`
	Prompt       string `json:"prompt"`
	OutputURL    string `json:"output_url,omitempty"`
	ErrorMessage string `json:"error_message,omitempty"`
}

// Terminal statuses end a walk.
const (
	StatusQueued            = "QUEUED"
	StatusRunning           = "RUNNING"
	StatusProviderSubmitted = "PROVIDER_SUBMITTED"
	StatusPostProcessing    = "POST_PROCESSING"
	StatusSucceeded         = "SUCCEEDED"
	StatusFailed            = "FAILED"
)

// AssetPath is where the demo serves a simulated output, by asset id.
const AssetPath = "/demo/assets/"

// Plan is every state of one simulated task, versions 1 upwards: queued
// at position queued down to 1, preprocessing, generating at the
// provider, post-processing, then the outcome. A failing task fails at the
// provider, after some progress. UpdatedAt is left for the publisher.
func Plan(spec Spec, taskID string, queued int) []State {
	provider, model := "veo", "veo-3"
	if spec.Kind == ImageToVideo {
		provider, model = "kling", "kling-2.1"
	}
	base := State{
		TaskID: taskID, TenantID: spec.TenantID, ProjectID: spec.ProjectID, UserID: spec.UserID,
		Provider: provider, Model: model, Kind: spec.Kind, Prompt: spec.Prompt,
	}
	var out []State
	add := func(status, stage string, progress int, edit func(*State)) {
		st := base
		st.Status, st.Stage, st.Progress = status, stage, progress
		st.Version = int64(len(out) + 1)
		if edit != nil {
			edit(&st)
		}
		out = append(out, st)
	}
	for pos := max(queued, 1); pos >= 1; pos-- {
		add(StatusQueued, "queued", 0, func(st *State) { st.QueuePosition = ptr(pos) })
	}
	add(StatusRunning, "preparing_inputs", 4, nil)
	add(StatusRunning, "prompt_enhancement", 10, nil)
	preview := "preview_" + taskID
	for i, p := range []int{18, 34, 51, 67, 80} {
		add(StatusProviderSubmitted, "provider_generating", p, func(st *State) {
			if i >= 2 {
				st.PreviewAssetID = &preview
			}
		})
		if spec.Fail && i == 2 {
			add(StatusFailed, "provider_generating", p, func(st *State) {
				st.PreviewAssetID = &preview
				st.ErrorCode = ptr("provider_content_rejected")
				st.ErrorMessage = "The provider rejected the generation request."
			})
			return out
		}
	}
	add(StatusPostProcessing, "upscaling", 88, func(st *State) { st.PreviewAssetID = &preview })
	add(StatusPostProcessing, "transcoding", 96, func(st *State) { st.PreviewAssetID = &preview })
	asset := "asset_" + taskID
	add(StatusSucceeded, "done", 100, func(st *State) {
		st.PreviewAssetID = &preview
		st.OutputAssetID = &asset
		st.OutputURL = AssetPath + asset + ".svg"
	})
	return out
}

func ptr[T any](v T) *T { return &v }
