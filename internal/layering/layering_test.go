package layering_test

import (
	"errors"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// drivers are the module paths no driver-free package may depend on.
var drivers = []string{"github.com/redis/go-redis", "github.com/jackc/pgx"}

func TestDriverFreePackages(t *testing.T) {
	gobin, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go command is needed to list dependencies: %v", err)
	}
	root := moduleRoot(t, gobin)
	for _, tc := range []struct {
		pkgs       []string
		wantDriver bool
	}{
		{[]string{"./sse", "./ws"}, false},
		{[]string{"./hub", "./snapshot", "./stream/cursor", "./auth"}, false},
		// The check checks itself: packages that do link a driver are seen.
		{[]string{"./fanout"}, true},
		{[]string{"./snapshot/store"}, true},
		{[]string{"./auth/session"}, true},
	} {
		t.Run(strings.Join(tc.pkgs, ","), func(t *testing.T) {
			found := linkedDrivers(t, gobin, root, tc.pkgs)
			switch {
			case tc.wantDriver && len(found) == 0:
				t.Errorf("%v links no driver; the check would miss one", tc.pkgs)
			case !tc.wantDriver && len(found) > 0:
				t.Errorf("%v must link no driver, but depend on %v", tc.pkgs, found)
			}
		})
	}
}

// linkedDrivers returns the driver packages among the dependencies of pkgs.
func linkedDrivers(t *testing.T, gobin, root string, pkgs []string) []string {
	t.Helper()
	cmd := exec.Command(gobin, append([]string{"list", "-deps"}, pkgs...)...)
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list -deps %v: %v\n%s", pkgs, err, stderr(err))
	}
	var found []string
	for _, dep := range strings.Fields(string(out)) {
		for _, d := range drivers {
			if dep == d || strings.HasPrefix(dep, d+"/") {
				found = append(found, dep)
			}
		}
	}
	return found
}

// moduleRoot is the directory of this module's go.mod.
func moduleRoot(t *testing.T, gobin string) string {
	t.Helper()
	out, err := exec.Command(gobin, "env", "GOMOD").Output()
	if err != nil {
		t.Fatalf("go env GOMOD: %v\n%s", err, stderr(err))
	}
	gomod := strings.TrimSpace(string(out))
	if gomod == "" || gomod == "/dev/null" {
		t.Fatal("go env GOMOD: not inside a module")
	}
	return filepath.Dir(gomod)
}

func stderr(err error) []byte {
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.Stderr
	}
	return nil
}
