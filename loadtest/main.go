// Command loadtest measures pushd the way its users will: thousands of SSE or
// WebSocket clients spread over several worker processes and loopback source
// addresses, a publisher doing what the Task State Service does, and the
// server, its Redis and its database started privately for the run.
//
//	go run ./loadtest -scenario fanout -transport sse -conns 10000 -tasks 1000 -rate 1000 -duration 20s
//	go run ./loadtest -quick            # every scenario at small scale, both transports
//	go run ./loadtest -cluster -scenario fanout -kill-master   # three nodes on Redis Cluster, a master killed
//	go run ./loadtest -scenario idle -nodes 4 -conns 40000 -limits production   # memory per connection, part by part
//	go run ./loadtest -scenario storm -storm-resume -repair-interval 2s   # clients resuming from stream cursors
//	go run ./loadtest -scenario fanout -nodes 3 -conns 3000 -tasks 300 -rate 300 -duration 10s -kill-node   # node 0 killed under load
//	go run ./loadtest -scenario fanout -nodes 3 -conns 3000 -tasks 300 -rate 300 -duration 10s -roll        # every node restarted in turn
//
// Scenarios: idle (memory per connection), fanout (latency, deliveries/s,
// convergence), churn (connections opening and closing under load), storm
// (every client reconnecting to a restarted node with Redis cold), outage
// (Redis killed and restarted under load), stall (healthy clients alone,
// then beside clients that subscribe and never read). With -cluster, idle,
// fanout and storm run on three nodes (or -nodes) over a private Redis
// Cluster, clients spread over them; -kill-master kills a master halfway
// through fanout's publishing. -nodes N runs N nodes on the private Redis
// (idle, fanout, churn, storm), and idle then reports the server's memory
// per connection node by node beside the workers', the kernel's and
// Redis's. With -nodes 2 or more, fanout's -kill-node SIGKILLs node 0
// halfway through the publishing: its clients dial the other nodes, as
// behind a balancer, and the run reports how long until the last of them
// had an event again, the other nodes' p99 meanwhile and their PostgreSQL
// reads per task moved. -roll restarts every node in turn instead, each
// with its drain, as a rolling deploy does, under load from a quarter of
// -duration until the roll is over. -limits production keeps pushd's
// admission limits, leases included, with per-address ones sized for the
// few source addresses.
// With -storm-resume, storm restarts a node running --streams with Redis
// kept instead: every task changes just before the stop, a share of them
// (-storm-moved) while the node is down, and the clients, resuming from
// their stream cursor (SSE) or version (WebSocket), count what they are
// sent until two repair intervals after every one is back and converged
// (events_per_client_after_resume, resent_unchanged, and the node's
// repairs in that quiet window). Each run writes a JSON result (-out) and
// prints a markdown table row for docs/BENCHMARKS.md; it exits non-zero
// when a connection did not converge or saw a version go backwards, or
// when the server kept connections or goroutines once every client left.
//
// -target centrifugo measures Centrifugo (a binary built by whoever runs
// it, -centrifugo-bin) with the same clients, pacing and snapshots, and
// -target both runs pushd, then Centrifugo, in one invocation: fanout and
// idle only.
//
// The controller re-executes itself with -worker for each worker process;
// workers read commands as JSON lines on stdin and answer on stdout.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

// workerEnv marks a re-executed worker process. The test binary checks it in
// TestMain, since it cannot take a -worker flag of its own.
const workerEnv = "PUSHD_LOADTEST_WORKER"

func main() {
	if os.Getenv(workerEnv) == "1" || (len(os.Args) > 1 && os.Args[1] == "-worker") {
		os.Exit(workerMain(os.Stdin, os.Stdout))
	}
	cfg, err := parseFlags(os.Args[1:], os.Stderr)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(0)
		}
		fmt.Fprintln(os.Stderr, "loadtest:", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ok, err := runAll(ctx, cfg, os.Stdout, os.Stderr)
	if err != nil {
		fmt.Fprintln(os.Stderr, "loadtest:", err)
		os.Exit(1)
	}
	if !ok {
		os.Exit(1)
	}
}
