// Package flagval defines the flags whose values the flag package has no
// type for, or words badly: the components register their settings with
// them (RegisterFlags), so that a setting's name, default and help live
// beside its field.
package flagval

import (
	"errors"
	"flag"
	"fmt"
	"strconv"
	"time"
)

// Duration defines a duration flag whose default is *p and whose errors
// say what a duration looks like: "25" needs a unit, which
// time.ParseDuration only hints at.
func Duration(fs *flag.FlagSet, p *time.Duration, name, usage string) {
	fs.Var((*duration)(p), name, usage)
}

type duration time.Duration

func (d *duration) String() string { return (*time.Duration)(d).String() }
func (d *duration) Get() any       { return time.Duration(*d) }

func (d *duration) Set(s string) error {
	v, err := time.ParseDuration(s)
	if err == nil {
		*d = duration(v)
		return nil
	}
	if _, nerr := strconv.ParseFloat(s, 64); nerr == nil {
		return fmt.Errorf("a duration needs a unit, e.g. %ss", s)
	}
	return errors.New("not a duration: want a number and a unit, e.g. 25s, 1m30s or 500ms")
}

// MapInt defines an int flag that is m's entry for key, with its value in
// m as the default.
func MapInt(fs *flag.FlagSet, m map[string]int, key, name, usage string) {
	fs.Var(mapInt{m, key}, name, usage)
}

type mapInt struct {
	m   map[string]int
	key string
}

func (v mapInt) String() string {
	if v.m == nil { // the zero value the flag package makes for -h
		return "0"
	}
	return strconv.Itoa(v.m[v.key])
}

func (v mapInt) Get() any { return v.m[v.key] }

// Set fails as the flag package's own int flags do, so the caller words
// the error alike.
func (v mapInt) Set(s string) error {
	n, err := strconv.ParseInt(s, 0, strconv.IntSize)
	if err != nil {
		return errors.New("parse error")
	}
	v.m[v.key] = int(n)
	return nil
}
