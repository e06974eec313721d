package web

import (
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/pushd/pushd/auth"
	"github.com/pushd/pushd/internal/httperr"
	"github.com/pushd/pushd/snapshot"
	"github.com/pushd/pushd/web/sim"
)

// DemoConfig wires the demo page to its node. Sim and Auth are required.
type DemoConfig struct {
	Sim *sim.Simulator
	// Auth verifies the bearer token of POST /demo/tasks: a simulated task
	// belongs to the token's tenant and user, so a page can only start
	// tasks where its own token could watch them.
	Auth *auth.Verifier
	// Tokens tells the page that GET /demo/token hands out tokens (the
	// embedded mode without a configured key), so that it asks there
	// rather than for a pasted token; a page that guessed would log a 404
	// on every load of a node that serves none.
	Tokens bool
	Logger *slog.Logger // nil means slog.Default()
}

// Demo serves the demo page, with the /demo prefix stripped:
//
//	GET  /               the page and its files
//	POST /tasks          start a simulated task: {"project_id","kind","prompt","fail"}
//	                     with Authorization: Bearer; 201 with {"task":<snapshot>}
//	GET  /assets/<id>.svg a simulated output
//	GET  /config         what the page needs to know of the node: {"tokens":bool}
//	GET  /me             the tenant and user of the bearer token, for the header
//
// GET /demo/token is not here: the API serves it only in the embedded mode
// without a configured key.
func Demo(cfg DemoConfig) http.Handler {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	d := &demo{cfg: cfg}
	mux := http.NewServeMux()
	mux.Handle("GET /", static(sub("demo"), false))
	mux.HandleFunc("POST /tasks", d.startTask)
	mux.HandleFunc("GET /tasks", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Allow", http.MethodPost)
		httperr.Write(w, http.StatusMethodNotAllowed, "method_not_allowed", "POST to start a simulated task")
	})
	mux.HandleFunc("GET /assets/{file}", serveAsset)
	mux.HandleFunc("GET /config", d.config)
	mux.HandleFunc("GET /me", d.me)
	return careful(mux)
}

// pagePolicy is the demo's Content-Security-Policy: scripts, styles and
// connections of its own origin only (no inline script, no eval), images
// of its own or over https (a task's output may be on a CDN), and no page
// of another site may frame it.
const pagePolicy = "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' https:; connect-src 'self'; " +
	"object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"

// careful sets the headers that keep the demo a careful page on every
// answer of it: the policy above, no framing for browsers that predate
// frame-ancestors, no Referer (the page's URL names a tenant and a user),
// and no type sniffing.
func careful(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hd := w.Header()
		hd.Set("Content-Security-Policy", pagePolicy)
		hd.Set("X-Frame-Options", "DENY")
		hd.Set("Referrer-Policy", "no-referrer")
		hd.Set("X-Content-Type-Options", "nosniff")
		h.ServeHTTP(w, r)
	})
}

type demo struct{ cfg DemoConfig }

type startRequest struct {
	ProjectID string `json:"project_id"`
	Kind      string `json:"kind"`
	Prompt    string `json:"prompt"`
	Fail      bool   `json:"fail"`
}

// maxStartBody bounds a start request; a prompt is cut to 200 bytes anyway.
const maxStartBody = 4 << 10

// principal authenticates the request's bearer token, or answers 401 and
// returns false. Only the Authorization header counts here, never a cookie:
// a page of another site cannot set it, so it cannot act in a visitor's
// name.
func (d *demo) principal(w http.ResponseWriter, r *http.Request) (auth.Principal, bool) {
	if !strings.HasPrefix(strings.ToLower(r.Header.Get("Authorization")), "bearer ") {
		httperr.Write(w, http.StatusUnauthorized, httperr.Unauthorized, "Authorization: Bearer <token> is required")
		return auth.Principal{}, false
	}
	p, err := d.cfg.Auth.Authenticate(r)
	switch {
	case err == nil:
		return p, true
	case errors.Is(err, auth.ErrTokenExpired):
		httperr.Write(w, http.StatusUnauthorized, httperr.TokenExpired, "the token expired")
	default:
		httperr.Write(w, http.StatusUnauthorized, httperr.Unauthorized, "invalid token")
	}
	return auth.Principal{}, false
}

func (d *demo) config(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, map[string]any{"tokens": d.cfg.Tokens})
}

// me names the token's tenant and user, as the node verified them: the
// page shows whom it is signed in as, whatever its URL says, and learns
// that a pasted token is no good before it connects with it.
func (d *demo) me(w http.ResponseWriter, r *http.Request) {
	p, ok := d.principal(w, r)
	if !ok {
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"tenant_id": p.TenantID, "user_id": p.UserID})
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		httperr.Write(w, http.StatusInternalServerError, httperr.Internal, "encode")
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	w.Write(append(b, '\n'))
}

func (d *demo) startTask(w http.ResponseWriter, r *http.Request) {
	p, ok := d.principal(w, r)
	if !ok {
		return
	}
	var req startRequest
	dec := json.NewDecoder(io.LimitReader(r.Body, maxStartBody))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		httperr.Write(w, http.StatusBadRequest, httperr.BadRequest, "body: want {\"project_id\",\"kind\",\"prompt\",\"fail\"}: "+httperr.Truncate(err.Error(), 100))
		return
	}
	if !snapshot.ValidID(req.ProjectID) {
		httperr.Write(w, http.StatusBadRequest, httperr.InvalidID, "invalid project_id")
		return
	}
	if req.Kind != "" && req.Kind != sim.TextToVideo && req.Kind != sim.ImageToVideo {
		httperr.Write(w, http.StatusBadRequest, httperr.BadRequest, fmt.Sprintf("kind must be %q or %q", sim.TextToVideo, sim.ImageToVideo))
		return
	}
	snap, err := d.cfg.Sim.Start(r.Context(), sim.Spec{
		TenantID: p.TenantID, UserID: p.UserID, ProjectID: req.ProjectID,
		Kind: req.Kind, Prompt: req.Prompt, Fail: req.Fail,
	})
	switch {
	case err == nil:
	case errors.Is(err, sim.ErrBusy):
		httperr.TooManyRequests(w, httperr.RateLimitExceeded, 2*time.Second, "too many simulated tasks are running; wait for one to finish")
		return
	case errors.Is(err, sim.ErrClosed):
		httperr.Write(w, http.StatusServiceUnavailable, httperr.Draining, "the node is shutting down")
		return
	default:
		d.cfg.Logger.Warn("demo: start task failed", "tenant", p.TenantID, "err", err)
		httperr.Write(w, http.StatusServiceUnavailable, httperr.Unavailable, "the task could not be published; retry")
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusCreated)
	fmt.Fprintf(w, `{"task":%s}`+"\n", snap.JSON())
}

// serveAsset draws a simulated output: a poster in colours taken from the
// asset id, so each task's output looks different.
func serveAsset(w http.ResponseWriter, r *http.Request) {
	id, ok := strings.CutSuffix(r.PathValue("file"), ".svg")
	if !ok || !snapshot.ValidID(id) {
		httperr.Write(w, http.StatusNotFound, httperr.NotFound, "no such asset")
		return
	}
	h := fnv.New32a()
	h.Write([]byte(id))
	hue := h.Sum32() % 360
	w.Header().Set("Content-Type", "image/svg+xml")
	w.Header().Set("Cache-Control", "public, max-age=86400")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	fmt.Fprintf(w, `<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 1280 720" width="1280" height="720">
<defs><linearGradient id="g" x1="0" y1="0" x2="1" y2="1">
<stop offset="0" stop-color="hsl(%d 70%% 55%%)"/><stop offset="1" stop-color="hsl(%d 70%% 30%%)"/></linearGradient></defs>
<rect width="1280" height="720" fill="url(#g)"/>
<circle cx="640" cy="360" r="90" fill="rgba(255,255,255,.2)"/><path d="M610 310 L700 360 L610 410 Z" fill="#fff"/>
<text x="40" y="680" font-family="sans-serif" font-size="28" fill="rgba(255,255,255,.85)">%s · simulated output</text>
</svg>
`, hue, (hue+40)%360, id)
}
