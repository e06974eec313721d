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

// heldStore keeps every document it is given, in order, and holds its
// first call until release closes: a publish API that pushes back.
type heldStore struct {
	release chan struct{}
	docs    [][]byte
}

func (h *heldStore) store(_ context.Context, _ int, doc []byte) (bool, error) {
	if len(h.docs) == 0 {
		<-h.release
	}
	h.docs = append(h.docs, append([]byte(nil), doc...))
	return true, nil
}

// TestScheduledTimeCountsTheBacklog: when the store holds the publisher
// up, every update still carries the time the schedule set for it, so
// the backlog behind the held publish counts as latency; the stamp is
// not the moment the schedule got round to handing the update over.
func TestScheduledTimeCountsTheBacklog(t *testing.T) {
	const rate, n = 4000.0, 2000 // more than a shard's queue holds
	h := &heldStore{release: make(chan struct{})}
	p := newPublisher(h, nil, "off", 1, 1, 1, 0)
	p.every = time.Millisecond
	// The first publish is held until the schedule is far behind it.
	hold := time.AfterFunc(300*time.Millisecond, func() { close(h.release) })
	defer hold.Stop()
	pr := p.run(context.Background(), rate, time.Duration(n/rate*float64(time.Second)))
	if pr.Sent != n || len(h.docs) != n {
		t.Fatalf("sent %d, stored %d, want %d", pr.Sent, len(h.docs), n)
	}
	first, _ := jsonInt(h.docs[0], `"sent_ns":`)
	for k, doc := range h.docs {
		sent, ok := jsonInt(doc, `"sent_ns":`)
		if !ok {
			t.Fatalf("no sent_ns in %s", doc)
		}
		// Both stamps are ticks of the schedule: k/rate apart, to a tick.
		want := time.Duration(float64(k) / rate * float64(time.Second))
		if got := time.Duration(sent - first); got < want-p.every || got > want+p.every {
			t.Fatalf("update %d stamped %v after the first, want its scheduled %v (±%v)", k, got, want, p.every)
		}
	}
}

// TestDueByHandsEachUpdateOutOnItsTick checks the schedule hands every
// update out on the tick it is stamped with: not before (its latency
// would start in the future) and not after (its wait would count the
// schedule's own delay), at rates above, at and below one update a tick.
func TestDueByHandsEachUpdateOutOnItsTick(t *testing.T) {
	for _, c := range []struct {
		rate  float64
		every time.Duration
	}{{100, time.Millisecond}, {400, time.Millisecond}, {1000, time.Millisecond}, {2500, time.Millisecond}, {1000, 100 * time.Millisecond}, {3, 100 * time.Millisecond}} {
		const total = 500
		var k int64
		for n := int64(1); k < total; n++ {
			due := dueBy(k, n, total, c.rate, c.every)
			for ; k < due; k++ {
				if at := scheduledTick(k, c.rate, c.every); at != n {
					t.Fatalf("%v/s, ticks of %v: update %d handed out at tick %d, stamped with tick %d", c.rate, c.every, k, n, at)
				}
			}
		}
	}
}

func TestScheduled(t *testing.T) {
	start := time.Unix(100, 0)
	for _, c := range []struct {
		k     int64
		rate  float64
		every time.Duration
		want  time.Duration
	}{
		{0, 1000, time.Millisecond, time.Millisecond},
		{5, 1000, time.Millisecond, 6 * time.Millisecond},
		{5, 1000, 100 * time.Millisecond, 100 * time.Millisecond},
		{99, 1000, 100 * time.Millisecond, 100 * time.Millisecond},
		{100, 1000, 100 * time.Millisecond, 200 * time.Millisecond},
		{3, 400, time.Millisecond, 8 * time.Millisecond},
	} {
		if got := scheduled(start, c.k, c.rate, c.every).Sub(start); got != c.want {
			t.Errorf("update %d at %v/s, ticks of %v: due %v after start, want %v", c.k, c.rate, c.every, got, c.want)
		}
	}
}
