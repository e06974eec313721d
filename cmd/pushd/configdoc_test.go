package main

import (
	"flag"
	"fmt"
	"os"
	"strings"
	"testing"
)

var updateConfigDoc = flag.Bool("update-config-doc", false, "rewrite the settings table of docs/CONFIG.md from the flags")

const (
	configDoc      = "../../docs/CONFIG.md"
	docTableStart  = "<!-- settings table: generated from the flags; go test ./cmd/pushd -run TestConfigDoc -update-config-doc -->\n"
	docTableFinish = "<!-- end of settings table -->\n"
)

// settingsTable is docs/CONFIG.md's tables of every flag, one per group
// of settingGroups as -h all lists them, from the flag set itself, so the
// page cannot drift from -h.
func settingsTable() string {
	var b strings.Builder
	fs := newFlagSet(&config{})
	for i, g := range settingGroups {
		if i > 0 {
			b.WriteString("\n")
		}
		fmt.Fprintf(&b, "### %s\n\n| flag | environment | file key | default | meaning |\n| --- | --- | --- | --- | --- |\n", g.name)
		for _, name := range g.flags {
			f := fs.Lookup(name)
			def := "none"
			if f.DefValue != "" {
				def = "`" + f.DefValue + "`"
			}
			key := "`" + f.Name + "`"
			if f.Name == "config" { // a config file cannot name another
				key = "none"
			}
			fmt.Fprintf(&b, "| `--%s` | `%s` | %s | %s | %s |\n", f.Name, envName(f.Name), key, def, strings.ReplaceAll(f.Usage, "|", `\|`))
		}
	}
	return b.String()
}

func TestConfigDocListsEverySetting(t *testing.T) {
	b, err := os.ReadFile(configDoc)
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	before, rest, ok1 := strings.Cut(doc, docTableStart)
	_, after, ok2 := strings.Cut(rest, docTableFinish)
	if !ok1 || !ok2 {
		t.Fatalf("%s lacks the markers %q and %q", configDoc, docTableStart, docTableFinish)
	}
	want := before + docTableStart + settingsTable() + docTableFinish + after
	if *updateConfigDoc {
		if err := os.WriteFile(configDoc, []byte(want), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	if doc != want {
		t.Errorf("%s's settings table differs from the flags: run go test ./cmd/pushd -run TestConfigDoc -update-config-doc", configDoc)
	}
}
