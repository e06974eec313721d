// Command pushd serves real-time task status to browsers over SSE and
// WebSocket. Run it with no configuration for the embedded mode; see
// pushd -h (or docs/CONFIG.md) for the flags, their PUSHD_* environment
// twins and the config file; pushd version prints the build's version, and
// pushd token mints and verifies client tokens with the node's settings.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/pushd/pushd/internal/adminhost"
	"github.com/pushd/pushd/internal/redislog"
	"github.com/pushd/pushd/node"
)

func main() {
	os.Exit(cli(os.Args[1:], os.Environ(), os.Stdin, os.Stdout, os.Stderr))
}

// cli runs one command line and returns the exit status: 0, 1 when the
// node or a command fails, 2 for a command line or setting it refuses.
func cli(args, environ []string, stdin io.Reader, stdout, stderr io.Writer) int {
	var err error
	cmd := ""
	if len(args) > 0 {
		cmd = args[0]
	}
	switch cmd {
	case "version", "-version", "--version":
		if len(args) == 2 && (args[1] == "-h" || args[1] == "-help" || args[1] == "--help") {
			fmt.Fprintln(stdout, "Usage: pushd version (or pushd --version)\n\nPrints the version, the commit and the Go release of this build.")
			break
		}
		if len(args) > 1 {
			err = usageErrorf("version takes no arguments")
			break
		}
		fmt.Fprintln(stdout, readBuildInfo())
	case "token":
		err = tokenCommand(args[1:], environ, stdin, stdout, stderr)
	case "migrate":
		err = migrateCommand(args[1:], environ, stdout)
	default:
		err = run(args, environ, stdout, stderr)
	}
	if err == nil || errors.Is(err, flag.ErrHelp) {
		return 0
	}
	fmt.Fprintln(stderr, "pushd:", err)
	if errors.As(err, new(usageError)) {
		return 2
	}
	return 1
}

func run(args, environ []string, stdout, stderr io.Writer) error {
	cfg, err := parseConfig(args, environ, stdout)
	if err != nil {
		return err
	}
	log, err := newLogger(cfg, stderr)
	if err != nil {
		return err
	}
	for _, w := range cfg.warnings {
		log.Warn(w.msg, w.args...)
	}
	bi := readBuildInfo()
	log.Info("pushd starting", "version", bi.Version, "commit", bi.Commit, "modified", bi.Modified, "config", cfg.ConfigFile)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	n, err := node.New(ctx, cfg.nodeConfig(bi.Version, log))
	if err != nil {
		return err
	}
	// Every listener is bound before the node says it serves, so a port in
	// use fails the start instead of a node that announced itself.
	l, al, dl, err := listen(cfg)
	if err != nil {
		n.Close()
		return err
	}
	n.LogStartup(l.Addr().String())
	if cfg.LogFormat == "text" { // plain lines would break a JSON log stream
		for _, h := range n.Hints(l.Addr().String()) {
			fmt.Fprintln(stderr, "  "+h)
		}
	}
	if al != nil {
		adminDone := make(chan struct{})
		go func() {
			defer close(adminDone)
			n.ServeAdmin(al) // returns once the node shuts down or closes
		}()
		defer func() { <-adminDone }()
		log.Info("admin serving", "addr", al.Addr().String(), "routes", "/metrics /healthz /readyz /inspect/tasks/{id}")
	}
	if dl != nil {
		// Profiles are for operators on a private address, never the public
		// one, and answer to the admin listener's names only.
		debugDone := make(chan struct{})
		srv := debugServer(cfg)
		go func() {
			defer close(debugDone)
			srv.Serve(dl) // returns once the server is closed
		}()
		defer func() {
			srv.Close()
			<-debugDone
		}()
		log.Info("pprof serving", "addr", dl.Addr().String())
	}
	served := make(chan error, 1)
	go func() { served <- n.Serve(l) }()
	select {
	case err := <-served:
		n.Close()
		return err
	case <-ctx.Done():
	}
	stop() // a second signal kills the process
	log.Info("draining", "timeout", cfg.DrainTimeout)
	dctx, cancel := context.WithTimeout(context.Background(), cfg.DrainTimeout)
	defer cancel()
	err = n.Shutdown(dctx)
	<-served
	if err != nil {
		log.Warn("drain ended early", "err", err)
	}
	log.Info("stopped")
	return nil
}

// listen binds the client listener and, when configured, the admin and
// debug ones (nil otherwise); on an error it closes what it bound.
func listen(cfg config) (l, admin, debug net.Listener, err error) {
	bind := func(flag, addr string) net.Listener {
		if addr == "" || err != nil {
			return nil
		}
		var nl net.Listener
		if nl, err = net.Listen("tcp", addr); err != nil {
			err = fmt.Errorf("%s %s: %w", flag, addr, err)
		}
		return nl
	}
	l = bind("--listen", cfg.Listen)
	admin = bind("--admin-listen", cfg.AdminListen)
	debug = bind("--debug-listen", cfg.DebugListen)
	if err != nil {
		for _, nl := range []net.Listener{l, admin, debug} {
			if nl != nil {
				nl.Close()
			}
		}
		return nil, nil, nil, err
	}
	return l, admin, debug, nil
}

// debugServer serves the profiles with the admin listener's deadlines, so
// a client that never finishes its request, or never reads, holds its
// connection only so long. A CPU profile or trace may ask for up to a
// minute less than the write timeout (pprof refuses longer ones).
func debugServer(cfg config) *http.Server {
	timeout := cfg.Node.WithDefaults().RequestTimeout
	return &http.Server{
		Handler:           adminhost.Handler(debugMux(), cfg.adminHosts()),
		ReadHeaderTimeout: timeout,
		ReadTimeout:       timeout,
		WriteTimeout:      2 * time.Minute,
		IdleTimeout:       2 * time.Minute,
	}
}

func debugMux() *http.ServeMux {
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	return mux
}

func newLogger(cfg config, w io.Writer) (*slog.Logger, error) {
	var level slog.Level
	if err := level.UnmarshalText([]byte(cfg.LogLevel)); err != nil {
		return nil, fmt.Errorf("log level: %w", err)
	}
	opts := &slog.HandlerOptions{Level: level, ReplaceAttr: durationString}
	var log *slog.Logger
	switch cfg.LogFormat {
	case "text":
		log = slog.New(slog.NewTextHandler(w, opts))
	case "json":
		log = slog.New(slog.NewJSONHandler(w, opts))
	default:
		return nil, fmt.Errorf("log format %q: want text or json", cfg.LogFormat)
	}
	redislog.Install(log) // go-redis's lines too: a JSON log stays JSON
	return log, nil
}

// durationString writes durations as "1.5s" in both formats; the JSON
// handler would write nanoseconds.
func durationString(_ []string, a slog.Attr) slog.Attr {
	if a.Value.Kind() == slog.KindDuration {
		a.Value = slog.StringValue(a.Value.Duration().String())
	}
	return a
}
