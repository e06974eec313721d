package main

import (
	"fmt"
	"runtime"
	"runtime/debug"
)

// version and commit are set when a release is built:
//
//	go build -ldflags "-X main.version=v1.2.3 -X main.commit=$(git rev-parse HEAD)" ./cmd/pushd
//
// Empty, they come from the build info: the main module's version ("(devel)"
// or a pseudo-version) and the commit go build stamps from the checkout.
// An image build usually has no .git to stamp from, hence -X.
var version, commit string

// buildInfo is what `pushd version` prints and the startup log carries.
type buildInfo struct {
	Version, Commit, Time, Go string
	Modified                  bool // the working tree had uncommitted changes
}

func readBuildInfo() buildInfo {
	b := buildInfo{Version: version, Commit: commit, Go: runtime.Version()}
	if bi, ok := debug.ReadBuildInfo(); ok {
		if b.Version == "" {
			b.Version = bi.Main.Version
		}
		// go build stamps these in a checkout with git at hand (unless
		// -buildvcs=false); a commit set with -X wins over them.
		if b.Commit == "" {
			for _, s := range bi.Settings {
				switch s.Key {
				case "vcs.revision":
					b.Commit = s.Value
				case "vcs.modified":
					b.Modified = s.Value == "true"
				case "vcs.time":
					b.Time = s.Value
				}
			}
		}
	}
	if b.Version == "" {
		b.Version = "(devel)"
	}
	if b.Commit == "" {
		b.Commit = "unknown"
	}
	return b
}

func (b buildInfo) String() string {
	s := fmt.Sprintf("pushd %s\ncommit %s", b.Version, b.Commit)
	if b.Modified {
		s += " (modified)"
	}
	if b.Time != "" {
		s += "\ncommitted " + b.Time
	}
	return s + fmt.Sprintf("\n%s %s/%s", b.Go, runtime.GOOS, runtime.GOARCH)
}
