package store_test

import (
	"testing"

	"github.com/pushd/pushd/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }
