package sse

import (
	"net/http"
	"net/url"
	"testing"

	"github.com/pushd/pushd/fanout"
	"github.com/pushd/pushd/hub"
	"github.com/pushd/pushd/snapshot"
	"github.com/pushd/pushd/stream/cursor"
)

// FuzzParseRequest feeds /v1/events query strings and Last-Event-ID
// headers. An accepted subscription holds at most the hub's MaxIDs valid ids and
// asks for something, and resumes from a stream cursor or from versions,
// never both; a refusal has a code and a bounded message.
func FuzzParseRequest(f *testing.F) {
	for _, seed := range [][2]string{
		{"task=task_1&task=task_2&project=p1&scope=user", ""},
		{"task=task_1", "task_1=18"},
		{"task=task_1&last_event_id=s1.AAAA", ""},
		{"task=task_1&task=task_2", "s1.AAAA.Ab-_Ab-_"},
		{"task=a%20b", ""},
		{"scope=all", ""},
		{"task=a&foo=1", ""},
		{"", "garbage"},
		{"task=a&task=a&task=a", "task_1=18,task_2=-3,=,==="},
		{"%zz", ""},
	} {
		f.Add(seed[0], seed[1])
	}
	h := newParser(f)
	f.Fuzz(func(t *testing.T, query, lastEventID string) {
		r := &http.Request{Method: http.MethodGet, URL: &url.URL{Path: "/v1/events", RawQuery: query}, Header: http.Header{}}
		if lastEventID != "" {
			r.Header.Set("Last-Event-ID", lastEventID)
		}
		sub, code, msg := h.ParseRequest(r)
		if code != "" {
			if msg == "" || len(msg) > 200 {
				t.Fatalf("refusal %q with message of %d bytes", code, len(msg))
			}
			return
		}
		if len(sub.Tasks)+len(sub.Projects) > h.limits.MaxIDs {
			t.Fatalf("accepted %d tasks and %d projects", len(sub.Tasks), len(sub.Projects))
		}
		if len(sub.Tasks) == 0 && len(sub.Projects) == 0 && !sub.User {
			t.Fatal("accepted a subscription to nothing")
		}
		for _, id := range append(sub.Tasks, sub.Projects...) {
			if !snapshot.ValidID(id) {
				t.Fatalf("accepted id %q", id)
			}
		}
		if sub.Resume != "" && (sub.ResumeMismatch || !cursor.Is(sub.Resume) || len(sub.Since) > 0) {
			t.Fatalf("resume cursor %q gave resume %q, mismatch %v, since %v", lastEventID, sub.Resume, sub.ResumeMismatch, sub.Since)
		}
		for id, v := range sub.Since {
			if !snapshot.ValidID(id) || v <= 0 {
				t.Fatalf("resume cursor %q gave %q=%d", lastEventID, id, v)
			}
		}
	})
}

// newParser is a Handler for parsing requests, on a hub of its own.
func newParser(tb testing.TB) *Handler {
	hb := hub.New(hub.Config{Source: snapshot.NewMemoryStore(), Bus: fanout.NewMemoryBus()})
	h := New(Config{Hub: hb})
	tb.Cleanup(func() {
		hb.Close()
		h.Close()
	})
	return h
}
