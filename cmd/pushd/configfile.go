package main

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"regexp"
	"strconv"
	"strings"
)

// The config file (--config) holds settings one a line:
//
//	# a comment: a whole line whose first non-blank character is #
//	redis-url = redis://redis:6379/0
//	drain-timeout = 30s
//	jwt-secret = "  a value with spaces kept, Go string syntax  "
//
// Keys are flag names; a value is the rest of the line with surrounding
// blanks trimmed, or a double-quoted Go string. A # inside a value is part
// of it (secrets and URLs may hold one). The format is close to the
// env files Docker and systemd read, needs no library, and keeps one name
// per setting everywhere: the flag, its file key, and PUSHD_ + that name in
// capitals for the environment.

// fileSetting is one line of a config file.
type fileSetting struct {
	line        int
	name, value string
}

var keyRE = regexp.MustCompile(`^[A-Za-z0-9_-]+$`)

// readConfigFile parses a config file; errors name the file and line.
func readConfigFile(path string) ([]fileSetting, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	b = bytes.TrimPrefix(b, []byte("\uFEFF")) // editors on some systems write a BOM
	var out []fileSetting
	first := make(map[string]int)
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(nil, 1<<20) // a PEM-sized value fits; a longer line is an error, not a truncation
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		where := fmt.Sprintf("%s:%d", path, n)
		name, value, ok := strings.Cut(line, "=")
		name, value = strings.TrimSpace(name), strings.TrimSpace(value)
		if !ok || name == "" {
			return nil, fmt.Errorf("%s: want name = value", where) // the line itself may be a secret
		}
		if !keyRE.MatchString(name) {
			return nil, fmt.Errorf("%s: %q is not a setting name (names are flag names, e.g. redis-url)", where, name)
		}
		if strings.HasPrefix(value, `"`) {
			uq, err := strconv.Unquote(value)
			if err != nil {
				return nil, fmt.Errorf("%s: %s: quoted value is not a valid Go string (a closing quote missing, or text after it?)", where, name)
			}
			value = uq
		}
		if l, dup := first[name]; dup {
			return nil, fmt.Errorf("%s: %s set again (first on line %d)", where, name, l)
		}
		first[name] = n
		out = append(out, fileSetting{line: n, name: name, value: value})
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return out, nil
}
