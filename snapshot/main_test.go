package snapshot_test

import (
	"fmt"
	"os"
	"testing"

	"go.uber.org/goleak"

	"github.com/pushd/pushd/testenv"
)

// TestMain drops the package's database after the tests and then checks that
// no goroutine outlived them. The leak check runs after Cleanup because the
// shared pgx pool's goroutines end only there.
func TestMain(m *testing.M) {
	code := m.Run()
	testenv.Cleanup()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintf(os.Stderr, "goleak: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}
