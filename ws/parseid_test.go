package ws

import (
	"math"
	"strconv"
	"strings"
	"testing"

	"github.com/pushd/pushd/fanout"
	"github.com/pushd/pushd/hub"
	"github.com/pushd/pushd/snapshot"
)

// A request's id is any JSON integer an int64 holds, as PROTOCOL says; a
// fraction or a larger number is a malformed request.
func TestRequestIDRange(t *testing.T) {
	hb := hub.New(hub.Config{Source: snapshot.NewMemoryStore(), Bus: fanout.NewMemoryBus()})
	t.Cleanup(hb.Close)
	h := New(Config{Hub: hb})
	for _, id := range []int64{math.MinInt64, -1, 0, 1 << 53, math.MaxInt64} {
		req, msg := h.parse([]byte(`{"op":"subscribe","id":` + strconv.FormatInt(id, 10) + `}`))
		if msg != "" || req.ID != id {
			t.Errorf("id %d: %q, read as %d", id, msg, req.ID)
		}
	}
	for _, id := range []string{"1.5", "9223372036854775808", "-9223372036854775809", `"7"`} {
		if _, msg := h.parse([]byte(`{"op":"subscribe","id":` + id + `}`)); !strings.HasPrefix(msg, "malformed request") {
			t.Errorf("id %s: %q, want a malformed request", id, msg)
		}
	}
}
