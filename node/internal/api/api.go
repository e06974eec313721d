// Package api is pushd's HTTP surface: the SSE and WebSocket endpoints
// behind authentication, task reads for re-fetching and polling clients,
// the publish endpoint, health and readiness.
package api

import (
	"context"
	"crypto/subtle"
	"errors"
	"flag"
	"hash/fnv"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/pushd/pushd/admission"
	"github.com/pushd/pushd/auth"
	"github.com/pushd/pushd/fanout"
	"github.com/pushd/pushd/hub"
	"github.com/pushd/pushd/internal/httperr"
	"github.com/pushd/pushd/snapshot"
)

// A Transport streams to clients over one protocol (packages sse, ws).
type Transport interface {
	// Serve streams to the client of r, authenticated as p, until either
	// end closes. The API has checked r's origin, limits, token and
	// admission first.
	Serve(w http.ResponseWriter, r *http.Request, p hub.Principal)
	// Close releases, or waits for, what the transport holds of the
	// connections the hub ended; call it after the hub's Shutdown or
	// Close.
	Close()
}

// A Refuser is a Transport that answers some of its endpoint's refusals in
// its own protocol (package sse: those an EventSource must survive). Refuse
// reports whether it answered; when it did not, it wrote nothing and the
// refusal is answered as on every endpoint. wait is a 429's, or a 503's
// Retry-After; zero when the refusal carries none.
type Refuser interface {
	Refuse(w http.ResponseWriter, r *http.Request, code string, wait time.Duration, message string) bool
}

// A Stream is a transport and the GET endpoint that serves it.
type Stream struct {
	Path      string
	Transport Transport
	// NoCORS marks a protocol no CORS protects, whose answer a page
	// reads whatever its origin (a WebSocket): a request from a foreign
	// origin is refused whatever carries its token, not only when it
	// carries the token cookie (checkOrigin).
	NoCORS bool
}

// Config wires the API to the node's parts. Hub, Source, Publisher, Auth
// and Streams are required.
type Config struct {
	Hub       *hub.Hub
	Source    snapshot.Source
	Publisher fanout.Publisher
	Auth      *auth.Verifier
	Streams   []Stream

	// APIKey guards POST /v1/publish (header X-API-Key). Empty means only
	// loopback callers may publish: the TCP peer and, behind
	// TrustedProxies, the client the proxy names.
	APIKey string
	// Ready reports the state of each snapshot source by name ("ok",
	// "down" or "not configured", never why: /readyz is public) and an
	// error, whose text is the reason, when none answers; nil means always
	// ready (the embedded mode).
	Ready func(ctx context.Context) (checks map[string]string, err error)
	// DemoSigner, when set, serves GET /demo/token: tokens for anyone. Only
	// the embedded mode without a configured secret or key sets it.
	DemoSigner *auth.Signer
	// Demo, when set, is served under /demo/ (GET, and POST for its
	// simulator), with the prefix stripped.
	Demo http.Handler
	// Client, when set, is served under /client/ (the JavaScript client),
	// with the prefix stripped.
	Client http.Handler
	// Version is the build's version, shown by GET /; empty means "(devel)".
	Version string
	// MaxIDs bounds GET /v1/tasks?ids=; zero means 100.
	MaxIDs int
	// MaxConns and MaxConnsPerIP bound the streams this node holds, in all
	// and per client address; zero means no limit.
	MaxConns      int
	MaxConnsPerIP int
	// MaxURLBytes bounds a request's URL; zero means 8 KiB.
	MaxURLBytes int
	// TrustedProxies are the load balancers whose X-Forwarded-For names
	// the client, for the per-address limits. Empty trusts no header: the
	// client is the TCP peer.
	TrustedProxies []*net.IPNet
	// AuthFailureBurst and AuthFailureRate are the token bucket of failed
	// authentications (invalid tokens, and session tokens the session store
	// could not look up: see failed) per client address: capacity and
	// refill per second. An address whose bucket is empty is answered 429
	// before its token is looked at. Either zero means no limit.
	// AuthFailureAddresses bounds the addresses tracked, the least recently
	// seen forgotten first; zero means 65536.
	AuthFailureBurst     int
	AuthFailureRate      float64
	AuthFailureAddresses int
	// AuthLimit, when set, is the buckets of the settings above as made by
	// NewAuthLimit, shared with the node's other paths that check tokens
	// (a WebSocket refresh); nil means New makes the API's own from them.
	AuthLimit *AuthLimit
	// OriginPatterns are the origins whose pages may open WebSockets and
	// read the streams and the snapshot API with credentials (CORS), as
	// the WebSocket endpoint takes them; empty allows none but the
	// server's own host (checkOrigin).
	OriginPatterns []string
	// Admission, when set, admits streams (connect buckets, connection caps)
	// and snapshot API calls (plan limits); nil admits everything.
	Admission *admission.Controller
	Logger    *slog.Logger // nil means slog.Default()
}

// RegisterFlags defines on fs a flag for each setting of c an operator
// sets, bound to its field, with the field's value as its default: call it
// on a Config with its defaults (DefaultConfig or WithDefaults).
func (c *Config) RegisterFlags(fs *flag.FlagSet) {
	fs.IntVar(&c.MaxConnsPerIP, "max-conns-per-ip", c.MaxConnsPerIP, "streams one client address may hold on this node (429 past it); 0 means no limit")
	fs.IntVar(&c.MaxURLBytes, "max-url-bytes", c.MaxURLBytes, "longest request URL, in bytes (414 past it); at most --max-header-bytes, which counts it too")
	fs.IntVar(&c.AuthFailureBurst, "auth-failure-burst", c.AuthFailureBurst, "failed authentications (invalid tokens, session lookups the store failed) a client address may make at once; past them it is answered 429 before its token is checked; 0 means no limit")
	fs.Float64Var(&c.AuthFailureRate, "auth-failure-rate", c.AuthFailureRate, "failed authentications per second a client address's bucket refills")
	fs.IntVar(&c.AuthFailureAddresses, "auth-failure-addresses", c.AuthFailureAddresses, "client addresses whose failed authentications this node tracks; past it the least recently seen are forgotten")
}

// DefaultConfig is the settings a node runs with unless told otherwise:
// WithDefaults, and the per-address limits that a zero leaves off.
func DefaultConfig() Config {
	c := Config{MaxConnsPerIP: 5000, AuthFailureBurst: 20, AuthFailureRate: 1}
	return c.WithDefaults()
}

// WithDefaults returns c with each zero setting that has a default set to
// it; it is the one place those defaults are written.
func (c Config) WithDefaults() Config {
	if c.MaxIDs <= 0 {
		c.MaxIDs = 100
	}
	if c.MaxURLBytes <= 0 {
		c.MaxURLBytes = 8 << 10
	}
	if c.AuthFailureAddresses <= 0 {
		c.AuthFailureAddresses = 1 << 16
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

type server struct {
	cfg      Config
	log      *slog.Logger
	failures *AuthLimit
	refusers map[string]Refuser // by route: the streams whose transport answers refusals itself
}

// New returns the HTTP handler of a node.
func New(cfg Config) http.Handler {
	cfg = cfg.WithDefaults()
	s := &server{cfg: cfg, log: cfg.Logger, failures: cfg.AuthLimit, refusers: make(map[string]Refuser)}
	if s.failures == nil {
		s.failures = NewAuthLimit(cfg)
	}
	for _, st := range cfg.Streams {
		if rf, ok := st.Transport.(Refuser); ok {
			s.refusers[st.Path] = rf
		}
	}
	e := echo.New()
	e.HideBanner, e.HidePort = true, true
	e.IPExtractor = ipExtractor(cfg.TrustedProxies)
	e.HTTPErrorHandler = s.handleError
	e.Pre(s.limitURL)
	e.Use(cors(cfg.OriginPatterns))

	// endpoint names the API window, and the endpoint in the limits' metrics.
	read := func(endpoint string, h func(echo.Context, hub.Principal) error) echo.HandlerFunc {
		return s.checkOrigin(false, s.authed(endpoint, s.limitAPI(endpoint, h)))
	}
	for _, st := range cfg.Streams {
		e.GET(st.Path, s.checkOrigin(st.NoCORS, s.limitStreams(s.authed(admission.EndpointConnect, s.admitStream(st.Transport.Serve)))))
	}
	e.GET("/v1/tasks/:id", read("task", s.getTask))
	e.GET("/v1/tasks", read("tasks", s.getTasks))
	e.GET("/v1/projects/:id/tasks", read("project_tasks", s.projectTasks))
	e.POST("/v1/publish", s.publish)
	e.Match([]string{http.MethodGet, http.MethodHead}, "/", s.index)
	e.GET("/healthz", s.healthz)
	e.GET("/readyz", s.readyz)
	if cfg.DemoSigner != nil {
		e.GET("/demo/token", s.demoToken)
	}
	if cfg.Demo != nil {
		e.GET("/demo", func(c echo.Context) error { return c.Redirect(http.StatusFound, "/demo/") })
		e.Match([]string{http.MethodGet, http.MethodHead, http.MethodPost}, "/demo/*", s.limitDemoAuth(echo.WrapHandler(http.StripPrefix("/demo", cfg.Demo))))
	}
	if cfg.Client != nil {
		e.Match([]string{http.MethodGet, http.MethodHead}, "/client/*", echo.WrapHandler(http.StripPrefix("/client", cfg.Client)))
	}
	return e
}

// RequestTimeout is the error code of a request whose body did not arrive
// within the node's request timeout (408).
const RequestTimeout = "request_timeout"

// apiError is an error with its status and code; handleError writes it.
type apiError struct {
	status        int
	code, message string
	wait          time.Duration // a 429's, or a 503's Retry-After: how long the client waits
}

func (e *apiError) Error() string { return e.code + ": " + e.message }

func fail(status int, code, message string) error {
	return &apiError{status: status, code: code, message: message}
}

// tooManyRequests is a 429 refusal telling the client to wait; code is
// httperr.RateLimitExceeded or httperr.TooManyConnections.
func tooManyRequests(code string, wait time.Duration, message string) error {
	return &apiError{status: http.StatusTooManyRequests, code: code, message: message, wait: wait}
}

func (s *server) handleError(err error, c echo.Context) {
	if c.Response().Committed {
		return
	}
	var ae *apiError
	var he *echo.HTTPError
	switch {
	case errors.As(err, &ae):
	case errors.As(err, &he):
		ae = &apiError{status: he.Code, code: codeForStatus(he.Code), message: strings.ToLower(http.StatusText(he.Code))}
	default:
		s.log.Error("request failed", "route", c.Path(), "err", err)
		ae = &apiError{status: http.StatusInternalServerError, code: httperr.Internal, message: "internal error"}
	}
	// The route, never the URL: a query may carry an access_token.
	s.log.Debug("request refused", "method", c.Request().Method, "route", c.Path(), "status", ae.status, "code", ae.code, "remote", c.RealIP())
	if rf := s.refusers[c.Path()]; rf != nil && rf.Refuse(c.Response(), c.Request(), ae.code, ae.wait, ae.message) {
		return
	}
	if ae.status == http.StatusTooManyRequests {
		httperr.TooManyRequests(c.Response(), ae.code, ae.wait, ae.message)
		return
	}
	if ae.wait > 0 {
		httperr.RetryAfter(c.Response(), ae.wait)
	}
	httperr.Write(c.Response(), ae.status, ae.code, ae.message)
}

func codeForStatus(status int) string {
	switch status {
	case http.StatusNotFound:
		return httperr.NotFound
	case http.StatusMethodNotAllowed:
		return "method_not_allowed"
	case http.StatusUnauthorized:
		return httperr.Unauthorized
	case http.StatusRequestEntityTooLarge:
		return "too_large"
	}
	return httperr.BadRequest
}

// authed authenticates the request before h runs, counting a failed check
// against the client address's bucket (AuthLimit, failed).
func (s *server) authed(endpoint string, h func(echo.Context, hub.Principal) error) echo.HandlerFunc {
	return func(c echo.Context) error {
		attempt, wait := s.failures.begin(c.RealIP())
		if wait > 0 {
			s.cfg.Admission.Refused(endpoint, admission.RuleAuthFailures, wait)
			return tooManyFailures(wait)
		}
		if s.failures != nil {
			s.cfg.Admission.Passed(endpoint, admission.RuleAuthFailures)
		}
		p, err := s.cfg.Auth.Authenticate(c.Request())
		attempt.end(failed(err))
		switch {
		case err == nil:
		case errors.Is(err, auth.ErrTokenExpired):
			return fail(http.StatusUnauthorized, httperr.TokenExpired, "the token expired")
		case errors.Is(err, auth.ErrUnavailable):
			return fail(http.StatusServiceUnavailable, httperr.Unavailable, "the session could not be checked; retry")
		case errors.Is(err, auth.ErrMissingToken):
			return fail(http.StatusUnauthorized, httperr.Unauthorized, "a token is required (Authorization: Bearer, cookie or access_token)")
		default:
			return fail(http.StatusUnauthorized, httperr.Unauthorized, "invalid token")
		}
		c.Set(principalKey, p)
		return h(c, HubPrincipal(p))
	}
}

// HubPrincipal is who a connection of p belongs to. The hub ends it when
// the node stops honouring the token, which for a JWT is the leeway past
// its exp: a token admitted inside the leeway is not cut at once.
func HubPrincipal(p auth.Principal) hub.Principal {
	return hub.Principal{TenantID: p.TenantID, UserID: p.UserID, ExpiresAt: p.EndsAt, Plan: p.Plan, Grant: p.Grant}
}

// onlyParams refuses query parameters other than allowed (and access_token,
// which any authenticated endpoint takes).
func onlyParams(c echo.Context, allowed ...string) error {
	return exactParams(c, append(allowed, "access_token")...)
}

// exactParams refuses query parameters other than allowed.
func exactParams(c echo.Context, allowed ...string) error {
	for k := range c.QueryParams() {
		if !slices.Contains(allowed, k) {
			return fail(http.StatusBadRequest, httperr.UnknownParameter, "unknown parameter "+httperr.Truncate(strconv.Quote(k), 64))
		}
	}
	return nil
}

func etag(s *snapshot.Snapshot) string { return `"v` + strconv.FormatInt(s.Version, 10) + `"` }

func (s *server) getTask(c echo.Context, p hub.Principal) error {
	if err := onlyParams(c); err != nil {
		return err
	}
	id := c.Param("id")
	if !snapshot.ValidID(id) {
		return fail(http.StatusBadRequest, httperr.InvalidID, "invalid task id")
	}
	snap, err := s.cfg.Source.Get(c.Request().Context(), id, 0)
	if err != nil {
		return s.readError(err)
	}
	if !p.Sees(snap) {
		return notFound() // exactly as absent
	}
	tag := etag(snap)
	h := c.Response().Header()
	h.Set("ETag", tag)
	h.Set("Cache-Control", "private, no-cache")
	if inm := c.Request().Header.Get("If-None-Match"); inm != "" && etagMatches(inm, tag) {
		return c.NoContent(http.StatusNotModified)
	}
	return c.JSONBlob(http.StatusOK, snap.JSON())
}

func etagMatches(header, tag string) bool {
	for part := range strings.SplitSeq(header, ",") {
		part = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(part), "W/"))
		if part == tag || part == "*" {
			return true
		}
	}
	return false
}

func notFound() error { return fail(http.StatusNotFound, httperr.NotFound, "no such task") }

func (s *server) readError(err error) error {
	switch {
	case errors.Is(err, snapshot.ErrNotFound):
		return notFound()
	case errors.Is(err, snapshot.ErrInvalidID):
		return fail(http.StatusBadRequest, httperr.InvalidID, "invalid id")
	case errors.Is(err, context.Canceled):
		return fail(499, "canceled", "the client went away")
	}
	s.log.Warn("snapshot read failed", "err", err)
	return fail(http.StatusServiceUnavailable, httperr.Unavailable, "task state is unavailable; retry")
}

type taskList struct {
	Tasks    []*snapshot.Snapshot `json:"tasks"`
	NotFound []string             `json:"not_found,omitempty"`
}

func (s *server) getTasks(c echo.Context, p hub.Principal) error {
	if err := onlyParams(c, "ids"); err != nil {
		return err
	}
	raw := c.QueryParam("ids")
	if raw == "" {
		return fail(http.StatusBadRequest, httperr.BadRequest, "ids is required: ?ids=a,b,c")
	}
	ids := strings.Split(raw, ",")
	if len(ids) > s.cfg.MaxIDs {
		return fail(http.StatusBadRequest, httperr.TooMany, "at most "+strconv.Itoa(s.cfg.MaxIDs)+" ids")
	}
	seen := make(map[string]bool, len(ids))
	uniq := ids[:0]
	for _, id := range ids {
		if !snapshot.ValidID(id) {
			return fail(http.StatusBadRequest, httperr.InvalidID, "invalid task id "+httperr.Truncate(strconv.Quote(id), 80))
		}
		if !seen[id] {
			seen[id] = true
			uniq = append(uniq, id)
		}
	}
	got, err := s.cfg.Source.GetMany(c.Request().Context(), uniq)
	if err != nil {
		return s.readError(err)
	}
	out := taskList{Tasks: make([]*snapshot.Snapshot, 0, len(uniq))}
	for _, id := range uniq {
		if snap, ok := got[id]; ok && p.Sees(snap) {
			out.Tasks = append(out.Tasks, snap)
		} else {
			out.NotFound = append(out.NotFound, id)
		}
	}
	return writeList(c, out)
}

// writeList answers with a list of tasks. Polling clients send back the
// ETag they got: the body is the same bytes while every version and the
// not-found set are, so a hash of those is a strong validator.
func writeList(c echo.Context, l taskList) error {
	f := fnv.New64a()
	var b []byte
	for _, s := range l.Tasks {
		b = append(b[:0], s.TaskID...)
		b = append(b, '=')
		b = strconv.AppendInt(b, s.Version, 10)
		b = append(b, ',')
		f.Write(b)
	}
	for _, id := range l.NotFound {
		f.Write(append(append(b[:0], id...), "=-,"...))
	}
	tag := `"l` + strconv.FormatUint(f.Sum64(), 36) + `"`
	h := c.Response().Header()
	h.Set("ETag", tag)
	h.Set("Cache-Control", "private, no-cache")
	if inm := c.Request().Header.Get("If-None-Match"); inm != "" && etagMatches(inm, tag) {
		return c.NoContent(http.StatusNotModified)
	}
	return c.JSON(http.StatusOK, l)
}

func (s *server) projectTasks(c echo.Context, p hub.Principal) error {
	if err := onlyParams(c); err != nil {
		return err
	}
	id := c.Param("id")
	if !snapshot.ValidID(id) {
		return fail(http.StatusBadRequest, httperr.InvalidID, "invalid project id")
	}
	snaps, err := s.cfg.Source.ListProject(c.Request().Context(), p.TenantID, id)
	if err != nil {
		return s.readError(err)
	}
	out := taskList{Tasks: make([]*snapshot.Snapshot, 0, len(snaps))}
	for _, snap := range snaps {
		if p.Sees(snap) {
			out.Tasks = append(out.Tasks, snap)
		}
	}
	return writeList(c, out)
}

// Codes of POST /v1/publish's refusals (409).
const (
	TenantMismatch   = "tenant_mismatch"   // the task is stored as another tenant's
	StoredUnreadable = "stored_unreadable" // the stored document's version cannot be read
)

type publishResult struct {
	Written bool   `json:"written"`
	TaskID  string `json:"task_id"`
	Version int64  `json:"version"`
}

func (s *server) publish(c echo.Context) error {
	if err := s.checkAPIKey(c); err != nil {
		return err
	}
	// Not even access_token: publishing takes no token, and a key put
	// there by mistake would otherwise pass unnoticed into access logs.
	if err := exactParams(c); err != nil {
		return err
	}
	body, err := io.ReadAll(io.LimitReader(c.Request().Body, snapshot.MaxSize+1))
	switch {
	case errors.Is(err, os.ErrDeadlineExceeded): // the server's ReadTimeout
		return fail(http.StatusRequestTimeout, RequestTimeout, "the body did not arrive in time")
	case err != nil:
		return fail(http.StatusBadRequest, httperr.BadRequest, "reading the body failed")
	}
	if len(body) > snapshot.MaxSize {
		return fail(http.StatusRequestEntityTooLarge, "too_large", "a snapshot is at most "+strconv.Itoa(snapshot.MaxSize)+" bytes")
	}
	snap, err := snapshot.Parse(body)
	if err != nil {
		return fail(http.StatusBadRequest, "invalid_snapshot", strings.TrimPrefix(err.Error(), "snapshot: "))
	}
	written, err := s.cfg.Publisher.Publish(c.Request().Context(), snap)
	switch {
	case err == nil:
	case errors.Is(err, snapshot.ErrTenantMismatch):
		// Task ids are global: storing it would take the task from its
		// owner. The owner is not named to the caller.
		s.log.Warn("publish refused: the task belongs to another tenant", "task", snap.TaskID, "tenant", snap.TenantID, "version", snap.Version)
		return fail(http.StatusConflict, TenantMismatch, "task "+snap.TaskID+" belongs to another tenant; its snapshot was not stored")
	case errors.Is(err, snapshot.ErrStoredUnreadable):
		s.log.Warn("publish refused: the stored snapshot cannot be read", "task", snap.TaskID, "version", snap.Version)
		return fail(http.StatusConflict, StoredUnreadable, "the stored snapshot of task "+snap.TaskID+
			" cannot be read, so no version can be proven newer; it is replaced once it expires")
	default:
		s.log.Warn("publish failed", "task", snap.TaskID, "err", err)
		return fail(http.StatusServiceUnavailable, httperr.Unavailable, "the snapshot could not be stored; retry")
	}
	return c.JSON(http.StatusOK, publishResult{Written: written, TaskID: snap.TaskID, Version: snap.Version})
}

func (s *server) checkAPIKey(c echo.Context) error {
	r := c.Request()
	if s.cfg.APIKey == "" {
		// Both the peer and the client it names (c.RealIP, the peer itself
		// unless it is a trusted proxy): a proxy on this host is a loopback
		// peer whoever its client is.
		host, _, _ := net.SplitHostPort(r.RemoteAddr)
		if !isLoopback(host) || !isLoopback(c.RealIP()) {
			return fail(http.StatusForbidden, httperr.Forbidden, "publishing without an API key is allowed from loopback only")
		}
		return checkNotFromPage(r)
	}
	key := r.Header.Get("X-API-Key")
	if key == "" {
		return fail(http.StatusUnauthorized, httperr.Unauthorized, "X-API-Key is required")
	}
	if subtle.ConstantTimeCompare([]byte(key), []byte(s.cfg.APIKey)) != 1 {
		return fail(http.StatusUnauthorized, httperr.Unauthorized, "invalid API key")
	}
	return nil
}

func isLoopback(host string) bool {
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// index is the GET / body: what this is and where to go, for whoever
// opens the node's address in a browser or with curl.
type index struct {
	Service string `json:"service"`
	Version string `json:"version"`
	Docs    string `json:"docs"`
	Demo    string `json:"demo,omitempty"` // only when the demo is served
	Health  string `json:"health"`
	Events  string `json:"events"`
}

func (s *server) index(c echo.Context) error {
	body := index{Service: "pushd", Version: s.cfg.Version, Docs: "docs/PROTOCOL.md in the repository",
		Health: "/healthz", Events: "/v1/events"}
	if body.Version == "" {
		body.Version = "(devel)"
	}
	if s.cfg.Demo != nil {
		body.Demo = "/demo/"
	}
	return c.JSON(http.StatusOK, body)
}

func (s *server) healthz(c echo.Context) error {
	return c.JSON(http.StatusOK, map[string]string{"status": "ok"})
}

// readiness is the /readyz body. A 503 also carries the error and message
// every other refusal has, so a client reading only those still learns why.
type readiness struct {
	Status  string         `json:"status"` // "ready" or "not_ready"
	Reason  string         `json:"reason,omitempty"`
	Checks  map[string]any `json:"checks"`
	Mode    string         `json:"mode,omitempty"` // push or polling, as clients are told
	Error   string         `json:"error,omitempty"`
	Message string         `json:"message,omitempty"`
}

func (s *server) readyz(c echo.Context) error {
	draining := s.cfg.Hub.Draining()
	body := readiness{Status: "ready", Checks: map[string]any{"draining": draining}}
	var notReady error
	if s.cfg.Ready != nil {
		ctx, cancel := context.WithTimeout(c.Request().Context(), 2*time.Second)
		defer cancel()
		var checks map[string]string
		checks, notReady = s.cfg.Ready(ctx)
		for name, state := range checks {
			body.Checks[name] = state
		}
	}
	body.Mode, _ = s.cfg.Hub.Mode()
	c.Response().Header().Set("Cache-Control", "no-store") // a cached answer would hide a change of state
	switch {
	case draining:
		body.Reason, body.Error = "draining", httperr.Draining
	case notReady != nil:
		body.Reason, body.Error = notReady.Error(), httperr.Unavailable
	default:
		return c.JSON(http.StatusOK, body)
	}
	body.Status, body.Message = "not_ready", body.Reason
	return c.JSON(http.StatusServiceUnavailable, body)
}

// demoToken hands out tokens for the demo page. It is only routed in the
// embedded mode with a random secret, where nothing real is protected.
func (s *server) demoToken(c echo.Context) error {
	if err := onlyParams(c, "tenant", "user", "projects"); err != nil {
		return err
	}
	tenant, user := c.QueryParam("tenant"), c.QueryParam("user")
	if tenant == "" {
		tenant = "demo"
	}
	if user == "" {
		user = "demo-user"
	}
	if !snapshot.ValidID(tenant) || !snapshot.ValidID(user) {
		return fail(http.StatusBadRequest, httperr.InvalidID, "invalid tenant or user")
	}
	// projects=p1,p2 (or *) grants projects, as the claim does; without
	// it the token sees its user's own tasks only.
	var projects []string
	if raw := c.QueryParam("projects"); raw != "" {
		projects = strings.Split(raw, ",")
	}
	grant, err := snapshot.ParseGrant(projects)
	if err != nil {
		return fail(http.StatusBadRequest, httperr.InvalidID, err.Error())
	}
	exp := time.Now().Add(time.Hour)
	tok, err := s.cfg.DemoSigner.Sign(auth.Principal{TenantID: tenant, UserID: user, ExpiresAt: exp, Grant: grant})
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, map[string]any{"token": tok, "tenant_id": tenant, "user_id": user, "projects": grant.Claim(), "expires_at": exp.Unix()})
}

// ipExtractor names a request's client: the TCP peer, or, behind trusted
// proxies, the nearest address in X-Forwarded-For that is not one of them.
// A header from any other peer is ignored, so a client cannot pick the
// address its limits are counted under.
func ipExtractor(trusted []*net.IPNet) echo.IPExtractor {
	if len(trusted) == 0 {
		return echo.ExtractIPDirect()
	}
	opts := []echo.TrustOption{echo.TrustLoopback(false), echo.TrustLinkLocal(false), echo.TrustPrivateNet(false)}
	for _, n := range trusted {
		opts = append(opts, echo.TrustIPRange(n))
	}
	return echo.ExtractIPFromXFFHeader(opts...)
}
