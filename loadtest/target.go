package main

import "strings"

// serverKind is what differs, for the controller, between the servers the
// loadtest can measure; everything else (workers, ramps, publisher pacing,
// histograms, CPU sampling, convergence) is the same code for both.
type serverKind struct {
	name string // pushd or centrifugo, as -target names it

	// snapshotOnSubscribe: a client that subscribes gets its task's current
	// snapshot at once. pushd does; Centrifugo without history sends only
	// what is published after the subscription, so its runs publish every
	// task once after every client connected instead of before.
	snapshotOnSubscribe bool

	connections string                // the series of live client connections
	deliveries  func(metrics) float64 // snapshots written to clients so far
	prefix      string                // the server's own series, kept in the result
}

var serverKinds = map[string]serverKind{
	"pushd": {
		name: "pushd", snapshotOnSubscribe: true,
		connections: "pushd_connections",
		deliveries:  func(m metrics) float64 { return m["pushd_deliveries_total"] },
		prefix:      "pushd_",
	},
	"centrifugo": {
		name:        "centrifugo",
		connections: "centrifugo_node_num_clients",
		deliveries:  centrifugoDeliveries,
		prefix:      "centrifugo_",
	},
}

// centrifugoDeliveries adds up the publications Centrifugo wrote to its
// clients, a series per transport and namespace.
func centrifugoDeliveries(m metrics) float64 {
	var n float64
	for k, v := range m {
		if strings.HasPrefix(k, "centrifugo_transport_messages_sent{") && strings.Contains(k, `frame_type="push_publication"`) {
			n += v
		}
	}
	return n
}

// runTargets are the servers a -target value measures, in order.
func runTargets(target string) []string {
	if target == "both" {
		return []string{"pushd", "centrifugo"}
	}
	return []string{target}
}
