package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"

	"github.com/redis/go-redis/v9"
)

// runAll builds pushd once and runs what cfg asks: one scenario, or with
// -quick every scenario for each transport, against each server -target
// names (pushd first). ok is false when a run did not converge or saw a
// regression.
func runAll(ctx context.Context, cfg config, stdout, stderr io.Writer) (ok bool, err error) {
	redis.SetLogger(quietRedis{})
	if soft, hard, err := raiseNoFile(); err != nil {
		fmt.Fprintf(stderr, "loadtest: raise RLIMIT_NOFILE: %v\n", err)
	} else if soft < uint64(cfg.PerWorker+1000) {
		fmt.Fprintf(stderr, "loadtest: RLIMIT_NOFILE is %d (hard %d): a worker cannot hold %d connections\n", soft, hard, cfg.PerWorker)
	}
	tmp, err := os.MkdirTemp("", "pushd-loadtest-")
	if err != nil {
		return false, err
	}
	defer os.RemoveAll(tmp)
	bins, commits, err := serverBins(ctx, cfg, tmp)
	if err != nil {
		return false, err
	}
	runs := cfg.runs()
	fmt.Fprintln(stdout, tableHeader)
	ok = true
	var results []*result
	for i, c := range runs {
		dir := filepath.Join(tmp, fmt.Sprintf("run%d", i))
		if cfg.FindMax {
			found, held := findMax(ctx, c, bins[c.Target], commits[c.Target], dir, stdout, stderr)
			results = append(results, found...)
			ok = ok && held
			if ctx.Err() != nil {
				break
			}
			continue
		}
		os.MkdirAll(dir, 0o755)
		res, _ := runOne(ctx, c, bins[c.Target], commits[c.Target], dir, stderr) // an error is in res.Problems
		res.report(stderr)
		fmt.Fprintln(stdout, res.row())
		results = append(results, res)
		ok = ok && res.OK
		if ctx.Err() != nil {
			break
		}
	}
	if cfg.Out != "" {
		var v any = results[0]
		if cfg.Quick || cfg.FindMax || len(runs) > 1 {
			v = results
		}
		b, err := json.MarshalIndent(v, "", "  ")
		if err != nil {
			return false, fmt.Errorf("-out: %w", err)
		}
		if err := os.WriteFile(cfg.Out, append(b, '\n'), 0o644); err != nil {
			return false, err
		}
	}
	if ctx.Err() != nil {
		return false, ctx.Err()
	}
	return ok, nil
}

// serverBins is the binary of each server cfg measures and what the
// result calls it: pushd built once for the whole invocation (a commit),
// Centrifugo as -centrifugo-bin names it (its version).
func serverBins(ctx context.Context, cfg config, tmp string) (bins, commits map[string]string, err error) {
	bins, commits = map[string]string{}, map[string]string{}
	for _, t := range runTargets(cfg.Target) {
		if t == "centrifugo" {
			commits[t], err = centrifugoVersion(ctx, cfg.CentrifugoBin)
			bins[t] = cfg.CentrifugoBin
		} else {
			bins[t], commits[t], err = buildServer(ctx, cfg, tmp)
		}
		if err != nil {
			return nil, nil, err
		}
	}
	return bins, commits, nil
}

// runs are the runs cfg asks for, with their scenario's defaults: one
// scenario, or with -quick every scenario (with -cluster: fanout, storm,
// and fanout with a master killed), for each transport and each target, in
// that nesting, so the runs of one setting against each server follow each
// other.
func (cfg config) runs() []config {
	type variant struct {
		scenario   string
		killMaster bool
	}
	var variants []variant
	switch {
	case cfg.Scenario != "":
		variants = []variant{{cfg.Scenario, cfg.KillMaster}}
	case cfg.Cluster:
		variants = []variant{{"fanout", false}, {"storm", false}, {"fanout", true}}
	default:
		for _, s := range scenarios {
			if cfg.Nodes > 1 && !slices.Contains(multiNodeScenarios, s) {
				continue // -quick on several nodes: the scenarios that run there
			}
			variants = append(variants, variant{s, false})
		}
	}
	transports := []string{cfg.Transport}
	if cfg.Transport == "" {
		transports = []string{"sse", "ws"}
	}
	if cfg.Target == "both" && cfg.PGWrites == "auto" {
		// Centrifugo's publisher writes no rows; pushd's then writes none
		// either, so the load generator's core carries the same work
		// beside both servers.
		cfg.PGWrites = "off"
	}
	var runs []config
	for _, v := range variants {
		for _, t := range transports {
			if v.scenario == "stall" && t != transports[0] {
				continue // one run has both transports
			}
			for _, target := range runTargets(cfg.Target) {
				c := cfg
				c.Scenario, c.KillMaster, c.Transport, c.Target = v.scenario, v.killMaster, t, target
				runs = append(runs, c.withDefaults())
			}
		}
	}
	return runs
}
