package flagval

import (
	"flag"
	"strings"
	"testing"
	"time"
)

func TestDurationSaysWhatADurationLooksLike(t *testing.T) {
	d := 25 * time.Second
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	Duration(fs, &d, "heartbeat", "")
	if got := fs.Lookup("heartbeat").DefValue; got != "25s" {
		t.Errorf("default %q, want 25s", got)
	}
	for value, want := range map[string]string{
		"25":   "a duration needs a unit, e.g. 25s",
		"soon": "not a duration: want a number and a unit",
	} {
		if err := fs.Set("heartbeat", value); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v, want %q", value, err, want)
		}
	}
	if err := fs.Set("heartbeat", "1m30s"); err != nil || d != 90*time.Second {
		t.Errorf("1m30s: %v, %v", d, err)
	}
}

func TestMapIntSetsItsEntryOnly(t *testing.T) {
	plans := map[string]int{"free": 60, "pro": 600}
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	MapInt(fs, plans, "free", "api-limit-free", "")
	if got := fs.Lookup("api-limit-free").DefValue; got != "60" {
		t.Errorf("default %q, want 60", got)
	}
	if err := fs.Set("api-limit-free", "7"); err != nil || plans["free"] != 7 || plans["pro"] != 600 {
		t.Errorf("after 7: %v, %v", plans, err)
	}
	if err := fs.Set("api-limit-free", "seven"); err == nil || plans["free"] != 7 {
		t.Errorf("seven: %v, %v", plans, err)
	}
}
