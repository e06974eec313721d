package testenv

import (
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Scrape reads /metrics into one value per series, keyed as
// name{label="value",...} with the labels sorted; a histogram gives its
// name_count and name_sum.
func Scrape(t testing.TB, base string) map[string]float64 {
	t.Helper()
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("/metrics: %d", resp.StatusCode)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	families, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("/metrics does not parse: %v", err)
	}
	out := make(map[string]float64)
	for name, f := range families {
		for _, m := range f.GetMetric() {
			var labels []string
			for _, l := range m.GetLabel() {
				labels = append(labels, fmt.Sprintf("%s=%q", l.GetName(), l.GetValue()))
			}
			slices.Sort(labels)
			suffix := ""
			if len(labels) > 0 {
				suffix = "{" + strings.Join(labels, ",") + "}"
			}
			switch {
			case m.Counter != nil:
				out[name+suffix] = m.GetCounter().GetValue()
			case m.Gauge != nil:
				out[name+suffix] = m.GetGauge().GetValue()
			case m.Histogram != nil:
				out[name+"_count"+suffix] = float64(m.GetHistogram().GetSampleCount())
				out[name+"_sum"+suffix] = m.GetHistogram().GetSampleSum()
			case m.Untyped != nil:
				out[name+suffix] = m.GetUntyped().GetValue()
			}
		}
	}
	return out
}
