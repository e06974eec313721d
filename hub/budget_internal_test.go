package hub

import (
	"strconv"
	"testing"
	"time"
)

// TestRewatchGraceIsTheUsersAndEnds: what a user's closed connection
// watched is free to watch again for that user only, until rewatchGrace
// after its last connection closed; past it, and past the cap on what is
// kept per user, reads are charged again.
func TestRewatchGraceIsTheUsersAndEnds(t *testing.T) {
	var b readBudgets
	b.init(1, 1, 3)
	alice, bob := key{"t1", "alice"}, key{"t1", "bob"}
	t0 := time.Unix(1000, 0)
	task := func(id string) watch { return watch{byTask, id} }
	b.closed(alice, []watch{task("a"), {byProject, "p"}, {by: byUser}, task("d")}, t0)

	for _, w := range []watch{task("a"), {byProject, "p"}, {by: byUser}} {
		if !b.rewatched(alice, w, t0.Add(rewatchGrace-time.Nanosecond)) {
			t.Errorf("%v not free for its user within the grace", w)
		}
		if b.rewatched(bob, w, t0) {
			t.Errorf("%v free for another user", w)
		}
		if b.rewatched(alice, w, t0.Add(rewatchGrace)) {
			t.Errorf("%v still free once the grace passed", w)
		}
	}
	if b.rewatched(alice, task("d"), t0) {
		t.Error("a watch past the cap of 3 was kept")
	}
	if b.rewatched(alice, watch{byProject, "a"}, t0) {
		t.Error("a project is free because a task of the same id was watched")
	}

	// A later close extends the user's grace to everything kept.
	b.closed(alice, []watch{task("b")}, t0.Add(rewatchGrace/2))
	if !b.rewatched(alice, task("a"), t0.Add(rewatchGrace)) {
		t.Error("the grace did not run from the user's last close")
	}
	// Past it, a close starts afresh, and sweep forgets the user.
	b.closed(alice, []watch{task("c")}, t0.Add(2*rewatchGrace))
	if b.rewatched(alice, task("a"), t0.Add(2*rewatchGrace)) {
		t.Error("a watch outlived its grace through a later close")
	}
	b.sweep(t0.Add(3 * rewatchGrace))
	if b.rewatchUsers() != 0 {
		t.Errorf("sweep kept %d users past their grace", b.rewatchUsers())
	}
}

// One user's budget is taken under a lock another user's does not wait
// for: a herd of subscribing connections, each holding its own lock while
// it takes its user's budget, must not queue on one lock.
func TestOneUsersBudgetHoldsNoOthers(t *testing.T) {
	var b readBudgets
	b.init(10, 10, 4)
	alice := key{"t1", "alice"}
	var other key
	for i := 0; ; i++ {
		other = key{"t1", "user_" + strconv.Itoa(i)}
		if b.shard(other) != b.shard(alice) {
			break
		}
	}
	sh := b.shard(alice)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	done := make(chan bool, 1)
	go func() {
		ok, _ := b.take(other, time.Now())
		done <- ok
	}()
	select {
	case ok := <-done:
		if !ok {
			t.Error("a user's first read refused")
		}
	case <-time.After(10 * time.Second): // a bound on the failure, not a wait for success
		t.Fatal("a user's budget waited for another user's lock")
	}
}
