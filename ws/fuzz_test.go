package ws

import (
	"testing"

	"github.com/pushd/pushd/fanout"
	"github.com/pushd/pushd/hub"
	"github.com/pushd/pushd/snapshot"
)

// FuzzParse feeds client messages to the request decoder. What it accepts
// is a subscribe or unsubscribe within the id limit, every id valid; what
// it refuses gets a short message that cannot echo a large input back.
func FuzzParse(f *testing.F) {
	for _, seed := range []string{
		`{"op":"subscribe","id":1,"tasks":["task_1","task_2"],"projects":["p1"],"since":{"task_1":18}}`,
		`{"op":"subscribe","id":2,"scope":"user"}`,
		`{"op":"unsubscribe","id":3,"tasks":["task_1"]}`,
		`{"op":"unsubscribe","id":3,"scope":"user"}`,
		`{"op":"subscribe","tasks":["../etc"]}`,
		`{"op":"subscribe","scope":"tenant"}`,
		`{"op":"publish"}`,
		`{"op":"subscribe","unknown":true}`,
		`{"op":"subscribe"}{"op":"subscribe"}`,
		`{"op":"subscribe","since":{"a":-1}}`,
		`[]`, `nul`, ``,
	} {
		f.Add([]byte(seed))
	}
	hb := hub.New(hub.Config{Source: snapshot.NewMemoryStore(), Bus: fanout.NewMemoryBus()})
	f.Cleanup(hb.Close)
	h := New(Config{Hub: hb})
	f.Fuzz(func(t *testing.T, data []byte) {
		req, msg := h.parse(data)
		if msg != "" {
			if len(msg) > 256 {
				t.Fatalf("refusal of %d bytes: %.80q...", len(msg), msg)
			}
			return
		}
		if req.Op != "subscribe" && req.Op != "unsubscribe" {
			t.Fatalf("accepted op %q", req.Op)
		}
		if len(req.Tasks)+len(req.Projects) > h.limits.MaxIDs || len(req.Since) > h.limits.MaxIDs {
			t.Fatalf("accepted %d tasks, %d projects, %d since entries", len(req.Tasks), len(req.Projects), len(req.Since))
		}
		for _, id := range append(req.Tasks, req.Projects...) {
			if !snapshot.ValidID(id) {
				t.Fatalf("accepted id %q", id)
			}
		}
		if req.Scope != "" && req.Scope != "user" {
			t.Fatalf("accepted scope %q", req.Scope)
		}
	})
}
