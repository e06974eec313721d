package main

import (
	"context"
	"testing"
	"time"
)

// keptDocs is a publisher's store that keeps the last document of each
// task, for tests of what the publisher writes.
type keptDocs map[int][]byte

func (k keptDocs) store(_ context.Context, task int, doc []byte) (bool, error) {
	k[task] = append([]byte(nil), doc...)
	return true, nil
}

// TestPublishStampsAndWaits: an update handed over late carries its due
// time in sent_ns (the wait behind the publisher counts as latency), or
// with -latency-from write the moment its write began; either way the
// publisher's wait window holds the wait.
func TestPublishStampsAndWaits(t *testing.T) {
	const late = 3 * time.Second
	for _, fromWrite := range []bool{false, true} {
		docs := keptDocs{}
		p := newPublisher(docs, nil, "off", 1, 1, 1, 0)
		p.fromWrite = fromWrite
		due := time.Now().Add(-late)
		before := time.Now()
		p.publish(context.Background(), 0, due, nil)
		sent, ok := jsonInt(docs[0], `"sent_ns":`)
		if !ok {
			t.Fatalf("no sent_ns in %s", docs[0])
		}
		stamp := time.Unix(0, sent)
		if fromWrite && stamp.Before(before) {
			t.Errorf("-latency-from write: sent_ns %v is before the publish began (%v)", stamp, before)
		}
		if !fromWrite && !stamp.Before(before) {
			t.Errorf("-latency-from due: sent_ns %v is not the due time %v", stamp, due)
		}
		w := p.waitWindow()
		if w == nil || time.Duration(w.ValueAtQuantile(99))*time.Microsecond < late {
			t.Fatalf("fromWrite %v: the wait window %v lacks a wait of %v", fromWrite, w, late)
		}
		if p.waitWindow() != nil {
			t.Error("a second window right after the first is not empty")
		}
	}
}
