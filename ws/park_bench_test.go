package ws

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/pushd/pushd/hub"
)

// BenchmarkParkedRoundTrip measures how long a parked connection takes to
// answer: a ping (answered by the gate) and a subscribe (answered by the
// hub through a reader), each sent to the next of 1,000 idle connections
// in turn, so every one arrives at a connection that parked since its
// last. It reports the median and the 99th percentile of the round trips.
func BenchmarkParkedRoundTrip(b *testing.B) {
	const conns = 1000
	for _, kind := range []string{"ping", "subscribe"} {
		b.Run(kind, func(b *testing.B) {
			_, addr := serveHub(b, hub.Config{}, Config{RequestRate: 1e6, RequestBurst: 1e6, ControlFrames: 1e6})
			clients := make([]*rawClient, conns)
			for i := range clients {
				c, err := rawDialErr(b, addr, frame(true, opText, []byte(`{"op":"subscribe","id":1}`)))
				if err != nil {
					b.Fatal(err)
				}
				if _, err := c.untilErr(opText, `"id":1`); err != nil {
					b.Fatal(err)
				}
				c.c.SetDeadline(time.Time{})
				clients[i] = c
			}
			rtts := make([]time.Duration, 0, b.N)
			b.ResetTimer()
			for i := range b.N {
				c := clients[i%conns]
				start := time.Now()
				var err error
				if kind == "ping" {
					c.c.Write(frame(true, opPing, []byte("p")))
					_, err = c.untilErr(opPong, "p")
				} else {
					c.c.Write(frame(true, opText, fmt.Appendf(nil, `{"op":"subscribe","id":%d}`, i+2)))
					_, err = c.untilErr(opText, fmt.Sprintf(`"id":%d,`, i+2))
				}
				if err != nil {
					b.Fatal(err)
				}
				rtts = append(rtts, time.Since(start))
			}
			b.StopTimer()
			slices.Sort(rtts)
			b.ReportMetric(float64(rtts[len(rtts)/2].Microseconds()), "p50-µs")
			b.ReportMetric(float64(rtts[len(rtts)*99/100].Microseconds()), "p99-µs")
		})
	}
}
