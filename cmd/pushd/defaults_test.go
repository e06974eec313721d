package main

import (
	"io"
	"reflect"
	"testing"

	"github.com/pushd/pushd/admission"
	"github.com/pushd/pushd/node"
)

// Every flag's default is its component's: a flag written with a default
// of its own sets its field to that at definition, so parsed from nothing
// the settings would differ from node.DefaultConfig, which each
// component's package fills in. Only what load fills in itself (the host
// name for the node name) is set aside.
func TestFlagDefaultsAreTheComponents(t *testing.T) {
	c, err := parseConfig(nil, env(), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	got, want := c.Node, node.DefaultConfig()
	got.NodeName = ""
	got.Logger, want.Logger = nil, nil
	diffs := diffFields("node.Config", reflect.ValueOf(got), reflect.ValueOf(want))
	for _, d := range diffs {
		t.Errorf("%s: the flag's default differs from the component's", d)
	}
	if len(diffs) == 0 && !reflect.DeepEqual(got, want) {
		t.Error("the settings differ from node.DefaultConfig where diffFields cannot see")
	}

	// A flag writes into its own config, never into the defaults another
	// parse starts from (the plans are a map).
	if _, err := parseConfig([]string{"--api-limit-free", "7"}, env(), io.Discard); err != nil {
		t.Fatal(err)
	}
	if n := node.DefaultConfig().Admission.Plans[admission.PlanFree]; n != admission.DefaultPlans()[admission.PlanFree] {
		t.Errorf("after --api-limit-free 7, the default free plan is %d", n)
	}
}

// diffFields names the exported fields, as dotted paths, where a and b
// differ.
func diffFields(path string, a, b reflect.Value) []string {
	if a.Kind() == reflect.Struct {
		var out []string
		for i := range a.NumField() {
			if f := a.Type().Field(i); f.IsExported() {
				out = append(out, diffFields(path+"."+f.Name, a.Field(i), b.Field(i))...)
			}
		}
		return out
	}
	if !reflect.DeepEqual(a.Interface(), b.Interface()) {
		return []string{path}
	}
	return nil
}
