package metrics

import (
	"flag"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

var updateDescs = flag.Bool("update-descs", false, "rewrite testdata/descs.txt from the collector")

const descsPath = "testdata/descs.txt"

// TestDescriptionsUnchanged holds every metric the collector can serve,
// with its help and labels, to testdata/descs.txt: dashboards and alerts
// depend on them, so a change to any is made on purpose, with the file.
func TestDescriptionsUnchanged(t *testing.T) {
	ch := make(chan *prometheus.Desc, 1024)
	(&collector{}).Describe(ch)
	close(ch)
	var lines []string
	for d := range ch {
		lines = append(lines, d.String())
	}
	slices.Sort(lines)
	got := strings.Join(lines, "\n") + "\n"
	if *updateDescs {
		if err := os.WriteFile(descsPath, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(descsPath)
	if err != nil {
		t.Fatal(err)
	}
	if got != string(want) {
		t.Errorf("the metrics' names, help or labels changed; if on purpose, run go test ./node/internal/metrics -run TestDescriptionsUnchanged -update-descs and commit %s", descsPath)
	}
}
