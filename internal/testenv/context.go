package testenv

import (
	"context"
	"testing"
	"time"
)

// Context returns a context that ends with the test or after a minute, so
// a hung server fails the test instead of the whole run.
func Context(t testing.TB) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}
