package node_test

import (
	"fmt"
	"net/http"
	"testing"

	"github.com/pushd/pushd/admission"
	"github.com/pushd/pushd/internal/testenv"
)

// Fifty users of one free tenant whose pages cannot stream poll what they
// watch, as the JavaScript client does (X-Pushd-Poll). Within each user's
// poll bucket a poll costs the tenant's API window nothing: none of the
// 150 polls is refused, where the same 150 reads unmarked, on a tenant of
// their own, get 5 through (the plan's window) and 145 refused. A poll
// past its user's bucket is an API call like any other: marking every
// call a poll buys a user its bucket, no more. The node counts both kinds.
func TestPollsOfOneTenantDoNotUseUpItsPlan(t *testing.T) {
	const users, polls, planLimit = 50, 3, 5
	c := newCluster(t)
	srv := admissionNode(t, c, admission.Config{
		Plans:         map[string]int{admission.PlanFree: planLimit},
		PollUserBurst: polls, PollUserRate: 0.001, // no refill within the test
	})
	// read makes polls reads of each user of tenant, one user after the
	// other, and counts the refused.
	read := func(tenant string, marked bool) (refused int) {
		for u := range users {
			tok := token(t, tenant, fmt.Sprintf("user_%d", u))
			for range polls {
				var header []string
				if marked {
					header = []string{"X-Pushd-Poll", "1"}
				}
				resp, body := httpDo(t, http.MethodGet, srv.URL+"/v1/tasks?ids=task_a,task_b", tok, "", header...)
				switch resp.StatusCode {
				case http.StatusOK:
				case http.StatusTooManyRequests:
					refused++
				default:
					t.Fatalf("read: %d %s", resp.StatusCode, body)
				}
			}
		}
		return refused
	}

	polling := testenv.UniqueID("free")
	if n := read(polling, true); n != 0 {
		t.Errorf("%d of %d polls refused, want none", n, users*polls)
	}
	if n := read(testenv.UniqueID("free"), false); n != users*polls-planLimit {
		t.Errorf("%d of %d unmarked reads refused, want %d: the plan's window", n, users*polls, users*polls-planLimit)
	}
	// Past its bucket, a user's poll is an API call: the polling tenant's
	// window is untouched, so its plan's calls pass, then no more.
	tok := token(t, polling, "user_0")
	for i := range planLimit + 1 {
		resp, body := httpDo(t, http.MethodGet, srv.URL+"/v1/tasks?ids=task_a,task_b", tok, "", "X-Pushd-Poll", "1")
		want := http.StatusOK
		if i == planLimit {
			want = http.StatusTooManyRequests
		}
		if resp.StatusCode != want {
			t.Fatalf("poll %d past the bucket: %d %s, want %d", i+1, resp.StatusCode, body, want)
		}
	}
	m := testenv.Scrape(t, srv.AdminURL)
	if free, charged := m[`pushd_admission_polls_total{outcome="free"}`], m[`pushd_admission_polls_total{outcome="charged"}`]; free != users*polls || charged != planLimit+1 {
		t.Errorf("polls counted free %v, charged %v; want %d and %d", free, charged, users*polls, planLimit+1)
	}
}
