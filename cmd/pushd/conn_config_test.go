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
		"writers":               {"4", "8", func(c config) string { return itoa(c.Conn.Writers) }},
		"max-subscriptions":     {"50", "60", func(c config) string { return itoa(c.Conn.MaxSubscriptions) }},
		"max-ids":               {"20", "30", func(c config) string { return itoa(c.Conn.MaxIDs) }},
		"subscribe-timeout":     {"3s", "4s", func(c config) string { return dur(c.Conn.SubscribeTimeout) }},
		"subscribe-reads":       {"5", "7.5", func(c config) string { return ftoa(c.Conn.SubscribeReads) }},
		"subscribe-read-burst":  {"40", "50", func(c config) string { return itoa(c.Conn.SubscribeReadBurst) }},
		"ws-max-message-bytes":  {"1024", "2048", func(c config) string { return strconv.FormatInt(c.Conn.WSMaxMessageBytes, 10) }},
		"ws-request-rate":       {"2", "3", func(c config) string { return ftoa(c.Conn.WSRequestRate) }},
		"ws-control-frames":     {"2", "3", func(c config) string { return ftoa(c.Conn.WSControlFrames) }},
		"ws-request-burst":      {"4", "5", func(c config) string { return itoa(c.Conn.WSRequestBurst) }},
		"ws-max-bad-messages":   {"2", "3", func(c config) string { return itoa(c.Conn.WSMaxBadMessages) }},
		"first-request-timeout": {"5s", "6s", func(c config) string { return dur(c.Conn.FirstRequestTimeout) }},
		"socket-send-buffer":    {"65536", "0", func(c config) string { return itoa(c.Conn.SendBuffer) }},
		"hot-task-watchers":     {"10", "20", func(c config) string { return itoa(c.Conn.HotTaskWatchers) }},
	} {
		flagCases[name] = fc
	}
}

func TestConnLimitsDefaultsAndRefusals(t *testing.T) {
	c, err := parseConfig(nil, env(), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if f := c.Conn; f.Writers != 32 || f.MaxSubscriptions != 200 || f.MaxIDs != 100 || f.SubscribeReads != 50 ||
		f.SubscribeReadBurst != 500 || f.WSMaxMessageBytes != 64<<10 || f.WSRequestRate != 10 || f.WSRequestBurst != 20 ||
		f.WSMaxBadMessages != 10 || f.FirstRequestTimeout != 10*time.Second || f.SubscribeTimeout != 10*time.Second ||
		f.HotTaskWatchers != 1000 {
		t.Fatalf("defaults %+v", f)
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
