package main

import (
	"io"
	"strconv"
	"testing"
	"time"
)

// The per-connection limits join flagCases, so the -h and env twin tests
// cover them too.
func init() {
	itoa := strconv.Itoa
	ftoa := func(f float64) string { return strconv.FormatFloat(f, 'g', -1, 64) }
	for name, fc := range map[string]flagCase{
		"writers":               {"4", "8", func(c config) string { return itoa(c.Node.Hub.Writers) }},
		"max-subscriptions":     {"50", "60", func(c config) string { return itoa(c.Node.Hub.MaxSubscriptions) }},
		"max-ids":               {"20", "30", func(c config) string { return itoa(c.Node.Hub.MaxIDs) }},
		"subscribe-timeout":     {"3s", "4s", func(c config) string { return dur(c.Node.Hub.SubscribeTimeout) }},
		"subscribe-reads":       {"5", "7.5", func(c config) string { return ftoa(c.Node.Hub.SubscribeReads) }},
		"subscribe-read-burst":  {"40", "50", func(c config) string { return itoa(c.Node.Hub.SubscribeReadBurst) }},
		"ws-max-message-bytes":  {"1024", "2048", func(c config) string { return strconv.FormatInt(c.Node.WS.ReadLimit, 10) }},
		"ws-request-rate":       {"2", "3", func(c config) string { return ftoa(c.Node.WS.RequestRate) }},
		"ws-control-frames":     {"2", "3", func(c config) string { return ftoa(c.Node.WS.ControlFrames) }},
		"ws-request-burst":      {"4", "5", func(c config) string { return itoa(c.Node.WS.RequestBurst) }},
		"ws-max-bad-messages":   {"2", "3", func(c config) string { return itoa(c.Node.WS.MaxBadMessages) }},
		"ws-compression":        {"true", "false", func(c config) string { return strconv.FormatBool(c.Node.WS.Compression) }},
		"first-request-timeout": {"5s", "6s", func(c config) string { return dur(c.Node.WS.FirstRequestTimeout) }},
		"socket-send-buffer":    {"65536", "0", func(c config) string { return itoa(c.Node.Hub.SendBuffer) }},
		"hot-task-watchers":     {"10", "20", func(c config) string { return itoa(c.Node.Hub.HotTaskWatchers) }},
	} {
		flagCases[name] = fc
	}
}

func TestConnLimitsDefaultsAndRefusals(t *testing.T) {
	c, err := parseConfig(nil, env(), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if f, w := c.Node.Hub, c.Node.WS; f.Writers != 32 || f.MaxSubscriptions != 200 || f.MaxIDs != 100 || f.SubscribeReads != 50 ||
		f.SubscribeReadBurst != 500 || w.ReadLimit != 64<<10 || w.RequestRate != 10 || w.RequestBurst != 20 ||
		w.MaxBadMessages != 10 || w.FirstRequestTimeout != 10*time.Second || f.SubscribeTimeout != 10*time.Second ||
		f.HotTaskWatchers != 1000 {
		t.Fatalf("defaults %+v %+v", f, w)
	}
	for _, args := range [][]string{
		{"--writers", "0"}, {"--max-ids", "-1"}, {"--subscribe-reads", "0"}, {"--subscribe-reads", "NaN"},
		{"--ws-max-message-bytes", "0"}, {"--first-request-timeout", "0s"}, {"--subscribe-read-burst", "0"},
		{"--hot-task-watchers", "0"},
	} {
		if _, err := parseConfig(args, env(), io.Discard); err == nil {
			t.Errorf("%v accepted", args)
		}
	}
}
