package converge_test

import (
	"testing"

	"github.com/pushd/pushd/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }
