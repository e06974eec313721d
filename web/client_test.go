package web_test

import (
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/pushd/pushd/internal/httperr"
	"github.com/pushd/pushd/node"
)

// The client's pure helpers, run in Chromium from the served module.
func TestClientHelpersInTheBrowser(t *testing.T) {
	n := startNode(t, node.Config{})
	b := newBrowser(t)
	p := b.tab(t)
	p.do("navigate", chromedp.Navigate(n.URL+"/healthz")) // any page of the origin
	failures := eval[[]string](p, `import('/client/pushd.js').then((m) => {
		const fails = [];
		const check = (what, ok) => { if (!ok) fails.push(what); };
		// Full jitter: below min(max, base * 2^attempt), from 0 up.
		check('jitter 0 at random 0', m.fullJitter(3, 500, 30000, () => 0) === 0);
		check('jitter attempt 0 below base', m.fullJitter(0, 500, 30000, () => 0.999) < 500);
		check('jitter doubles', m.fullJitter(2, 500, 30000, () => 0.999) >= 1990 && m.fullJitter(2, 500, 30000, () => 0.999) < 2000);
		check('jitter capped', m.fullJitter(40, 500, 30000, () => 0.999) < 30000 && m.fullJitter(40, 500, 30000, () => 0.999) > 29000);
		let spread = new Set();
		for (let i = 0; i < 50; i++) spread.add(m.fullJitter(5, 500, 30000));
		check('jitter spreads', spread.size > 40);
		check('retry-after seconds', m.parseRetryAfter('2') === 2000);
		check('retry-after date', m.parseRetryAfter(new Date(Date.now() + 3000).toUTCString(), Date.now()) > 1000);
		check('retry-after garbage', m.parseRetryAfter('soon') === null && m.parseRetryAfter(null) === null);
		check('terminal', m.isTerminal('FAILED') && !m.isTerminal('RUNNING'));
		// Versions only go up, whatever order snapshots come in.
		const c = new m.PushdClient({ token: 'x' });
		const shown = [];
		c.addEventListener('task', (e) => shown.push(e.detail.task.version));
		for (const v of [2, 1, 2, 5, 3, 6]) c.offer({ task_id: 'a', version: v, status: 'RUNNING' });
		check('newest wins: ' + shown.join(','), shown.join(',') === '2,5,6' && c.task('a').version === 6);
		check('drops counted', c.stats.dropped === 3);
		const idle = new m.PushdClient({ token: 'x' });
		check('idle without subscriptions', (idle.start(), idle.state === 'idle'));
		idle.close();
		check('closed', idle.state === 'closed');
		return fails;
	})`)
	if len(failures) > 0 {
		t.Fatalf("client checks failed: %v", failures)
	}
}

// rateLimiter answers the first stream requests with 429 and Retry-After,
// as a rate limit in front of the node would, and records when each stream
// request came.
type rateLimiter struct {
	next    http.Handler
	limited int // requests to refuse

	mu    sync.Mutex
	times []time.Time
}

func (rl *rateLimiter) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != "/v1/events" && r.URL.Path != "/v1/ws" {
		rl.next.ServeHTTP(w, r)
		return
	}
	rl.mu.Lock()
	rl.times = append(rl.times, time.Now())
	refuse := len(rl.times) <= rl.limited
	rl.mu.Unlock()
	if refuse {
		httperr.RetryAfter(w, 2*time.Second)
		httperr.Write(w, http.StatusTooManyRequests, httperr.RateLimited, "too many connections")
		return
	}
	rl.next.ServeHTTP(w, r)
}

// An EventSource or WebSocket cannot read a 429's Retry-After; the client
// probes for it and waits that long before the next attempt, although its
// own backoff would come back sooner.
func TestClientHonoursRetryAfterOn429(t *testing.T) {
	b := newBrowser(t)
	for _, transport := range transports {
		t.Run(transport, func(t *testing.T) {
			n := startNode(t, node.Config{})
			// Two refusals: the connection and the client's probe of it.
			rl := &rateLimiter{next: n.Handler(), limited: 2}
			base := serve(t, rl)
			p := b.tab(t)
			p.open(base, "transport="+transport+"&backoff_ms=50")
			if log := p.logText(); !strings.Contains(log, "(http_429)") {
				p.fatalf("the activity log does not show the 429")
			}
			rl.mu.Lock()
			defer rl.mu.Unlock()
			if len(rl.times) < 3 {
				p.fatalf("%d stream requests, want the refused one, the probe and a retry", len(rl.times))
			}
			if gap := rl.times[2].Sub(rl.times[1]); gap < 1900*time.Millisecond {
				p.fatalf("retried %v after a 429 with Retry-After: 2", gap)
			}
		})
	}
}
