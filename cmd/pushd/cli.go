package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// usageError is a command line or a setting pushd refuses; main exits 2 for
// it, and 1 for a node or command that fails once started.
type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() }
func (e usageError) Unwrap() error { return e.err }

func usageErrorf(format string, args ...any) error {
	return usageError{fmt.Errorf(format, args...)}
}

// parseArgs parses args into fs. -h and --help print fs's usage on stdout
// and return flag.ErrHelp. Any other error is one line naming the flag as
// --name, with the closest known flag for one that does not exist; the
// flag package's own message and usage dump are discarded.
func parseArgs(fs *flag.FlagSet, args []string, stdout io.Writer) error {
	fs.SetOutput(io.Discard)
	err := fs.Parse(args)
	if err == nil {
		return nil
	}
	if errors.Is(err, flag.ErrHelp) {
		fs.SetOutput(stdout)
		if fs.Name() == nodeFlags && helpAll(args) {
			printUsage(stdout, fs, true)
		} else {
			fs.Usage()
		}
		return err
	}
	hint := fmt.Sprintf("run %s -h for the flags", fs.Name())
	msg := err.Error()
	if name, ok := strings.CutPrefix(msg, "flag provided but not defined: -"); ok {
		name = strings.TrimPrefix(name, "-")
		var known []string
		fs.VisitAll(func(f *flag.Flag) { known = append(known, f.Name) })
		if guess := closest(name, known); guess != "" {
			return usageErrorf("unknown flag --%s; did you mean --%s? (%s)", name, guess, hint)
		}
		return usageErrorf("unknown flag --%s (%s)", name, hint)
	}
	if name, ok := strings.CutPrefix(msg, "flag needs an argument: -"); ok {
		return usageErrorf("--%s needs a value (%s)", strings.TrimPrefix(name, "-"), hint)
	}
	if m := badValueRE.FindStringSubmatch(msg); m != nil {
		value, err := strconv.Unquote(m[1])
		if err != nil {
			value = m[1]
		}
		return usageErrorf("--%s %s: %s", m[2], value, valueReason(fs.Lookup(m[2]), m[3]))
	}
	return usageErrorf("%s (%s)", msg, hint)
}

// badValueRE matches the flag package's message for a value a flag
// refused; its Value's error is flattened into it.
var badValueRE = regexp.MustCompile(`^invalid (?:boolean )?value (".*") for (?:flag )?-([a-z0-9-]+): (.*)$`)

// valueReason words the flag package's terse "parse error" by the type
// the flag wants.
func valueReason(f *flag.Flag, reason string) string {
	if f == nil || reason != "parse error" {
		return reason
	}
	g, ok := f.Value.(flag.Getter)
	if !ok {
		return reason
	}
	switch g.Get().(type) {
	case bool:
		return "want true or false"
	case int, int64, uint, uint64:
		return "want a whole number"
	case float64:
		return "want a number"
	}
	return reason
}

// closest returns the name in known nearest to name, or "" when none is
// near enough to be a likely typo.
func closest(name string, known []string) string {
	best, bestD := "", -1
	for _, k := range known {
		if d := editDistance(strings.ToLower(name), strings.ToLower(k)); bestD < 0 || d < bestD {
			best, bestD = k, d
		}
	}
	if bestD < 0 || bestD > max(2, len(name)/4) {
		return ""
	}
	return best
}

// editDistance is the optimal string alignment distance of a and b: the
// insertions, deletions, substitutions and swaps of neighbours that turn
// one into the other, so "ulr" is one edit from "url".
func editDistance(a, b string) int {
	d := make([][]int, len(a)+1)
	for i := range d {
		d[i] = make([]int, len(b)+1)
		d[i][0] = i
	}
	for j := range d[0] {
		d[0][j] = j
	}
	for i := 1; i <= len(a); i++ {
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			d[i][j] = min(d[i-1][j]+1, d[i][j-1]+1, d[i-1][j-1]+cost)
			if i > 1 && j > 1 && a[i-1] == b[j-2] && a[i-2] == b[j-1] {
				d[i][j] = min(d[i][j], d[i-2][j-2]+1)
			}
		}
	}
	return d[len(a)][len(b)]
}

// warning is something a start reports and goes on: a setting that works
// but is probably a mistake.
type warning struct {
	msg  string
	args []any // slog key-value pairs
}

// String renders w for a command that has no logger.
func (w warning) String() string {
	var b strings.Builder
	b.WriteString(w.msg)
	for i := 0; i+1 < len(w.args); i += 2 {
		fmt.Fprintf(&b, " %v=%v", w.args[i], w.args[i+1])
	}
	return b.String()
}

// environment is the process environment as getenv sees it: the first of
// two entries with one name wins, as it does for os.Getenv.
type environment map[string]string

func newEnvironment(environ []string) environment {
	m := make(environment, len(environ))
	for _, kv := range environ {
		k, v, _ := strings.Cut(kv, "=")
		if _, dup := m[k]; !dup {
			m[k] = v
		}
	}
	return m
}

// unknownVariables warns of every PUSHD_* variable that names no setting,
// with the closest one that does: a misspelt variable is otherwise
// silently ignored.
func (e environment) unknownVariables(fs *flag.FlagSet) []warning {
	var known []string
	fs.VisitAll(func(f *flag.Flag) { known = append(known, envName(f.Name)) })
	var out []warning
	for _, k := range slices.Sorted(maps.Keys(e)) {
		if !strings.HasPrefix(k, "PUSHD_") || (fs.Lookup(flagName(k)) != nil && envName(flagName(k)) == k) {
			continue
		}
		// The test suite's own variables (scripts/test) are not settings.
		if strings.HasPrefix(k, "PUSHD_TEST_") || strings.HasPrefix(k, "PUSHD_FUZZ_") {
			continue
		}
		args := []any{"name", k}
		if guess := closest(k, known); guess != "" {
			args = append(args, "did_you_mean", guess)
		}
		out = append(out, warning{"unknown environment variable, ignored", args})
	}
	return out
}

// flagName is the flag an environment variable is the twin of:
// PUSHD_REDIS_URL is --redis-url.
func flagName(envVar string) string {
	return strings.ToLower(strings.ReplaceAll(strings.TrimPrefix(envVar, "PUSHD_"), "_", "-"))
}
