// Package node wires a pushd node from its settings: the snapshot source,
// the bus, the hub, the transports and the HTTP API, in the embedded mode
// (in memory) or on standalone Redis or a Redis Cluster, PostgreSQL behind
// either. cmd/pushd and the end-to-end tests both start nodes through it.
package node

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/pushd/pushd/admission"
	"github.com/pushd/pushd/auth"
	"github.com/pushd/pushd/converge"
	"github.com/pushd/pushd/fanout"
	"github.com/pushd/pushd/hub"
	"github.com/pushd/pushd/internal/adminhost"
	"github.com/pushd/pushd/internal/framing"
	"github.com/pushd/pushd/internal/httperr"
	"github.com/pushd/pushd/node/internal/api"
	"github.com/pushd/pushd/node/internal/metrics"
	"github.com/pushd/pushd/snapshot/store"
	"github.com/pushd/pushd/sse"
	"github.com/pushd/pushd/stream"
	"github.com/pushd/pushd/web"
	"github.com/pushd/pushd/web/sim"
	"github.com/pushd/pushd/ws"
)

// Node is a running pushd node.
type Node struct {
	cfg     Config
	tuning  TestTuning
	log     *slog.Logger
	be      *backend
	hub     *hub.Hub
	streams []api.Stream // the transports and their endpoints
	adm     *admission.Controller
	sim     *sim.Simulator // nil unless the demo is served
	handler http.Handler
	srv     *http.Server
	admin   *http.Server // the admin listener's: /metrics, health, the inspector

	// demoSigner signs the tokens of GET /demo/token: set on an embedded
	// node started without a key, whose secret it makes up.
	demoSigner *auth.Signer

	closeMu sync.Mutex // a Close waits for one in progress (a Shutdown's) instead of racing it
}

// The hub is the handler of every bus; it implements their interfaces
// without naming them, so the assertion lives here, where the two meet.
var (
	_ fanout.Handler           = (*hub.Hub)(nil)
	_ fanout.LossHandler       = (*hub.Hub)(nil)
	_ fanout.TenantLossHandler = (*hub.Hub)(nil)
)

// New builds a node and connects it to its servers. It does not listen yet.
func New(ctx context.Context, cfg Config, opts ...Option) (*Node, error) {
	cfg = cfg.WithDefaults()
	if problems := cfg.Problems(); len(problems) > 0 {
		errs := make([]error, len(problems))
		for i, p := range problems {
			errs[i] = p
		}
		return nil, errors.Join(errs...)
	}
	n := &Node{cfg: cfg, log: cfg.Logger}
	for _, o := range opts {
		o(&n.tuning)
	}
	if len(cfg.JWTSecret) == 0 && len(cfg.JWTPublicKeyPEM) == 0 { // embedded: Problems says so
		n.cfg.JWTSecret = auth.RandomSecret()
		n.demoSigner = auth.NewSigner(n.cfg.JWTSecret)
	}
	var err error
	if n.be, err = newBackend(ctx, n.cfg, n.tuning); err != nil {
		return nil, err
	}
	// The last step that can fail: the rest only assembles.
	verifier, err := n.verifier()
	if err != nil {
		n.be.close()
		return nil, err
	}
	n.adm = admission.New(n.admissionConfig())
	hc := cfg.Hub
	hc.Source, hc.Bus, hc.Stream = n.be.source, n.be.hubBus, n.be.hubStream
	hc.Plans, hc.NodeName, hc.Logger = planNames(cfg.Admission.Plans), cfg.NodeName, cfg.Logger
	n.hub = hub.New(hc)
	n.be.start(n.hub, n.tuning)
	// One set of failed-authentication buckets for the API and the
	// WebSocket refresh: an address's allowance is spent by either.
	limit := api.NewAuthLimit(cfg.API)
	wc := cfg.WS
	wc.Hub, wc.OriginPatterns, wc.Authenticate, wc.Logger = n.hub, cfg.API.OriginPatterns, refresher(verifier, limit), cfg.Logger
	sc := cfg.SSE
	sc.Hub, sc.Logger = n.hub, cfg.Logger
	n.streams = []api.Stream{
		{Path: sse.Path, Transport: sse.New(sc)},
		{Path: ws.Path, Transport: ws.New(wc), NoCORS: true},
	}
	n.handler = api.New(n.apiConfig(verifier, limit, n.demo(verifier)))
	// Made here, not in Serve, so Shutdown from another goroutine always
	// finds it. ReadTimeout bounds the reading of a request, body included:
	// without it a Content-Length whose body never comes holds a connection
	// for good. It ends there: net/http clears the deadline once the body is
	// read, and taking a stream's connection over (SSE, the WebSocket
	// upgrade) clears it too.
	n.srv = &http.Server{
		Handler:           framing.Handler(n.handler),
		ConnContext:       framing.ConnContext,
		ReadHeaderTimeout: cfg.RequestTimeout,
		ReadTimeout:       cfg.RequestTimeout,
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    cfg.MaxHeaderBytes,
		ErrorLog:          slog.NewLogLogger(cfg.Logger.Handler(), slog.LevelDebug),
	}
	n.admin = &http.Server{
		Handler:           n.adminHandler(),
		ReadHeaderTimeout: cfg.RequestTimeout,
		ReadTimeout:       cfg.RequestTimeout,
		WriteTimeout:      time.Minute, // a scrape, however slow its reader
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    cfg.MaxHeaderBytes,
		ErrorLog:          slog.NewLogLogger(cfg.Logger.Handler(), slog.LevelDebug),
	}
	return n, nil
}

// adminHandler serves what is for operators only, never on the client
// listener: /metrics, the delivery inspector (/inspect/tasks/{id}: which
// connections here watch a task and what each was sent), and /healthz and
// /readyz as the client listener answers them, for probes that only reach
// the admin port. Every route answers only to the listener's own names
// (Config.AdminHosts).
func (n *Node) adminHandler() http.Handler {
	registry := metrics.NewRegistry(metrics.Sources{Hub: n.hub, Store: n.be.store, Bus: n.be.busStats, Stream: n.be.tailer, Admission: n.adm, Publisher: n.be.published, Reconcile: n.be.reconcileStats(), Changes: n.be.changeStats(), Repair: n.be.repairStats(), RedisPools: n.be.redisPools, Postgres: n.be.postgresPool()})
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(registry, promhttp.HandlerOpts{ErrorLog: slog.NewLogLogger(n.cfg.Logger.Handler(), slog.LevelWarn)}))
	mux.Handle("GET /healthz", n.handler)
	mux.Handle("GET /readyz", n.handler)
	mux.HandleFunc("GET /inspect/tasks/{id}", n.inspectTask)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		httperr.Write(w, http.StatusNotFound, httperr.NotFound, "the admin listener serves /metrics, /healthz, /readyz and /inspect/tasks/{id}")
	})
	return adminhost.Handler(mux, n.cfg.AdminHosts)
}

// planNames are the configured plans (admission's defaults when none are):
// the only plan labels of the connection metrics.
func planNames(plans map[string]int) []string {
	if plans == nil {
		plans = admission.DefaultPlans()
	}
	return slices.Sorted(maps.Keys(plans))
}

// refresher checks a WebSocket refresh's token with the verifier that
// checked the connection's first, counting its failures against the
// client's address as the API counts them: on an open connection a client
// may send refreshes at its request rate, on each of its connections. It
// names the token's session (empty for a JWT), which the connection
// answers to from then on.
func refresher(v *auth.Verifier, limit *api.AuthLimit) func(context.Context, string, string) (hub.Principal, string, error) {
	return func(ctx context.Context, client, token string) (hub.Principal, string, error) {
		p, wait, err := limit.Check(ctx, v, client, token)
		switch {
		case wait > 0:
			return hub.Principal{}, "", &ws.LimitedError{Wait: wait}
		case errors.Is(err, auth.ErrTokenExpired):
			return hub.Principal{}, "", fmt.Errorf("%w: %w", ws.ErrTokenExpired, err)
		case errors.Is(err, auth.ErrUnavailable):
			return hub.Principal{}, "", fmt.Errorf("%w: %w", ws.ErrUnavailable, err)
		case err != nil:
			return hub.Principal{}, "", err
		}
		return api.HubPrincipal(p), p.Session, nil
	}
}

// verifier checks JWTs with the node's key and, with Redis, session
// tokens in the control Redis with PostgreSQL behind.
func (n *Node) verifier() (*auth.Verifier, error) {
	c := n.cfg
	vcfg := auth.Config{Secret: c.JWTSecret, PublicKeyPEM: c.JWTPublicKeyPEM, Algorithm: c.JWTAlgorithm,
		Audience: c.JWTAudience, Issuer: c.JWTIssuer, MaxTTL: c.JWTMaxTTL}
	if n.be.sessions != nil { // a nil *session.Store in the interface would not be nil
		vcfg.Sessions = n.be.sessions
	}
	return auth.New(vcfg)
}

// admissionConfig is the operator's admission settings on the control
// Redis (none embedded: local limits only).
func (n *Node) admissionConfig() admission.Config {
	acfg := n.cfg.Admission
	if n.be.sessions != nil {
		acfg.Sessions = n.be.sessions
	}
	if n.be.control != nil {
		acfg.Redis = n.be.control
	}
	acfg.Prefix, acfg.Logger = n.cfg.KeyPrefix, n.cfg.Logger
	return acfg
}

// demo is the demo page and its simulator, when served (always embedded).
// With a database the simulator commits each state there before it
// publishes, as a Task State Service does.
func (n *Node) demo(verifier *auth.Verifier) http.Handler {
	if !n.cfg.Demo && !n.cfg.Embedded() {
		return nil
	}
	n.sim = sim.New(sim.Config{Publisher: n.be.publisher, DB: n.be.pool, Step: n.tuning.DemoStep, Logger: n.log})
	return web.Demo(web.DemoConfig{Sim: n.sim, Auth: verifier, Tokens: n.demoSigner != nil, Logger: n.log})
}

func (n *Node) apiConfig(verifier *auth.Verifier, limit *api.AuthLimit, demo http.Handler) api.Config {
	c := n.cfg.API
	c.Hub, c.Source, c.Publisher, c.Auth, c.AuthLimit = n.hub, n.be.source, n.be.publisher, verifier, limit
	c.Streams, c.Admission, c.Ready = n.streams, n.adm, n.be.ready
	c.APIKey, c.DemoSigner, c.Demo, c.Client, c.Version = n.cfg.APIKey, n.demoSigner, demo, web.Client(), n.cfg.Version
	c.MaxConns, c.Logger = maxConns(n.cfg.MaxConns), n.cfg.Logger
	return c
}

// Handler is the node's HTTP handler.
func (n *Node) Handler() http.Handler { return n.handler }

// Store is the node's Redis and PostgreSQL snapshot store; nil in the
// embedded mode.
func (n *Node) Store() *store.Store { return n.be.store }

// Hub is the node's hub.
func (n *Node) Hub() *hub.Hub { return n.hub }

// Admission is the node's admission controller.
func (n *Node) Admission() *admission.Controller { return n.adm }

// Stream is the node's stream tailer; nil without streams.
func (n *Node) Stream() *stream.Tailer { return n.be.tailer }

// Repairer is the node's repair rounds; nil in the embedded mode.
func (n *Node) Repairer() *converge.Repairer { return n.be.repairer }

// Serve accepts connections on l until Shutdown or Close. Serve after
// Shutdown returns at once.
func (n *Node) Serve(l net.Listener) error {
	err := n.srv.Serve(framing.Listener{Listener: l, MaxHead: cmp.Or(n.cfg.MaxHeaderBytes, http.DefaultMaxHeaderBytes) + 4096})
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}

// ServeAdmin serves the admin listener on l (/metrics, /healthz, /readyz,
// /inspect/tasks/{id}) until Shutdown or Close; keep l private: the
// inspector names users and connections. ServeAdmin after Shutdown
// returns at once.
func (n *Node) ServeAdmin(l net.Listener) error {
	err := n.admin.Serve(l)
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}

// Shutdown drains the node: it tells clients to reconnect after a jittered
// delay and closes connections in batches within ctx's deadline, then stops
// accepting and releases the servers. The listener stays open while the
// hub drains, so a balancer's health check and new connections get 503
// draining (a JSON body with the code) rather than a refused connection.
func (n *Node) Shutdown(ctx context.Context) error {
	err := n.hub.Shutdown(ctx, n.cfg.ReconnectAfter)
	if n.srv != nil {
		if serr := n.srv.Shutdown(ctx); err == nil {
			err = serr
		}
	}
	if n.admin != nil {
		n.admin.Shutdown(ctx) // a scrape in flight ends; the client listener's error is the one that counts
	}
	n.Close()
	return err
}

// Close stops the node at once. It is idempotent and safe beside a
// Shutdown in progress.
func (n *Node) Close() {
	n.closeMu.Lock()
	defer n.closeMu.Unlock()
	n.srv.Close()
	n.admin.Close()
	if n.sim != nil { // the demo's, when served
		n.sim.Close() // before the bus and store its walks publish through
	}
	n.be.stopDelivering() // before the hub its jobs deliver to
	n.hub.Close()
	for _, s := range n.streams {
		s.Transport.Close() // after the hub, which ended every connection
	}
	n.adm.Close() // after the hub: it releases what the closed connections held
	n.be.close()  // the bus, the tailer and the store, then their clients
}

// LogStartup logs how the node runs.
func (n *Node) LogStartup(addr string) {
	if n.cfg.Embedded() {
		n.log.Info("pushd serving in embedded mode (in-memory bus and store, one node)", "addr", addr, "node", n.cfg.NodeName)
		return
	}
	n.log.Info("pushd serving", append([]any{"addr", addr, "node", n.cfg.NodeName, "redis", true}, n.be.attrs...)...)
}

// Hints are the commands that feed an embedded node, for a person at a
// terminal; a node with Redis has none.
func (n *Node) Hints(addr string) []string {
	if !n.cfg.Embedded() {
		return nil
	}
	base := "http://" + displayAddr(addr)
	out := []string{"open the demo:    " + base + "/demo/"}
	if n.demoSigner != nil {
		out = append(out, "get a token:      TOKEN=$(curl -s '"+base+"/demo/token?tenant=t1&user=u1' | sed 's/.*\"token\":\"\\([^\"]*\\)\".*/\\1/')")
	}
	return append(out,
		"watch a task:     curl -N -H \"Authorization: Bearer $TOKEN\" '"+base+"/v1/events?task=task_1'",
		"publish a change: curl -X POST "+base+"/v1/publish -H 'Content-Type: application/json' -d '{\"task_id\":\"task_1\",\"tenant_id\":\"t1\",\"project_id\":\"p1\",\"user_id\":\"u1\",\"status\":\"RUNNING\",\"progress\":45,\"version\":1,\"updated_at\":1710000000000}'",
	)
}

func displayAddr(addr string) string {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return addr
	}
	if host == "" || host == "::" || host == "0.0.0.0" {
		host = "localhost"
	}
	return net.JoinHostPort(host, port)
}

// An EventSource refused for a reason that passes is answered in a stream
// it survives (sse.Handler.Refuse), not with a status it gives up on.
var _ api.Refuser = (*sse.Handler)(nil)
