package web_test

import (
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httputil"
	"net/url"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/chromedp/chromedp"

	"github.com/pushd/pushd/internal/testenv"
	"github.com/pushd/pushd/node"
)

// waitReconnect waits for the page to count a reconnect after before, and
// to stream again.
func (p *page) waitReconnect(before int, transport string) {
	p.t.Helper()
	p.wait("a reconnect shown", fmt.Sprintf(`Number(document.getElementById('conn').dataset.reconnects) > %d`, before))
	p.waitConn("streaming", transport)
}

func (p *page) logText() string {
	p.t.Helper()
	return eval[string](p, `document.getElementById('log').innerText`)
}

// logOf is the activity log's lines of one task.
func (p *page) logOf(task string) string {
	p.t.Helper()
	return eval[string](p, fmt.Sprintf(`[...document.querySelectorAll('#log li[data-task-id=%q]')].map((li) => li.innerText).join('\n')`, task))
}

func TestCutConnectionReconnectsAndEndsAtNewestVersions(t *testing.T) {
	n := startNode(t, node.Config{})
	// A fault proxy between the browser and the node cuts connections from
	// the server's side; the page's control cuts them from its own.
	proxy := testenv.StartProxy(t, strings.TrimPrefix(n.URL, "http://"))
	base := "http://" + proxy.Addr
	b := newBrowser(t)
	for _, transport := range transports {
		t.Run(transport, func(t *testing.T) {
			tenant := "cut-" + transport
			p := b.tab(t)
			p.open(base, "tenant="+tenant+"&transport="+transport+"&backoff_ms=300")
			p.start("text_to_video", false)
			p.start("image_to_video", true)
			p.start("text_to_video", false)

			before := p.reconnects()
			p.do("cut", chromedp.Click(chromedp.ID("cut")))
			p.waitReconnect(before, transport)

			before = p.reconnects()
			proxy.CloseAll()
			p.waitReconnect(before, transport)

			p.waitAllTerminal()
			p.checkNewest(n.URL, demoToken(t, n.URL, tenant, "demo-user"))
			log := p.logText()
			if !strings.Contains(log, "Connection cut from this page") || !strings.Contains(log, "Connection lost") {
				p.fatalf("the activity log does not show the cuts")
			}
			// A wait is worded in s, in ms or as now, never as 0.0 s.
			if !regexp.MustCompile(`reconnecting (now|in [0-9]+ ms|in [0-9]+\.[0-9] s)`).MatchString(log) || strings.Contains(log, "in 0.0 s") {
				p.fatalf("the activity log words the reconnect's wait badly:\n%s", log)
			}
		})
	}
}

// front is a load balancer in front of nodes: streams go to the node it
// currently points at, everything else to api.
func front(t *testing.T, api string, streams *atomic.Pointer[httputil.ReverseProxy]) string {
	t.Helper()
	rp := proxyTo(t, api)
	return serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/events" || r.URL.Path == "/v1/ws" {
			streams.Load().ServeHTTP(w, r)
			return
		}
		rp.ServeHTTP(w, r)
	}))
}

func proxyTo(t *testing.T, base string) *httputil.ReverseProxy {
	t.Helper()
	u, err := url.Parse(base)
	if err != nil {
		t.Fatal(err)
	}
	rp := httputil.NewSingleHostReverseProxy(u)
	rp.FlushInterval = -1
	rp.ErrorLog = log.New(io.Discard, "", 0) // a node going away is the point
	return rp
}

// Two Redis-backed nodes share Redis and PostgreSQL. The page streams from
// the first, which drains: the page follows the server's reconnect hint to
// the second and ends with every task at its newest version.
func TestNodeDrainMovesPageToAnotherNode(t *testing.T) {
	redis := testenv.SharedRedis(t)
	pg := testenv.Database(t)
	cfg := func() node.Config {
		return node.Config{RedisURL: redis.URL, KeyPrefix: redis.Names.Prefix, DatabaseURL: pg.URL, JWTSecret: testSecret, Demo: true}
	}
	b := newBrowser(t)
	for _, transport := range transports {
		t.Run(transport, func(t *testing.T) {
			first, second := startNode(t, cfg()), startNode(t, cfg())
			var streams atomic.Pointer[httputil.ReverseProxy]
			streams.Store(proxyTo(t, first.URL))
			// The simulator runs on the second node, which stays up, so the
			// tasks outlive the first.
			base := front(t, second.URL, &streams)
			tenant := "drain-" + transport
			token := signedToken(t, tenant, "demo-user")

			p := b.tab(t)
			p.open(base, "tenant="+tenant+"&transport="+transport+"#token="+token)
			p.wait("the first node's name", fmt.Sprintf(`document.getElementById('f-node').textContent === %q`, first.Name))
			p.start("text_to_video", false)
			p.start("image_to_video", false)

			before := p.reconnects()
			streams.Store(proxyTo(t, second.URL))
			first.shutdown(t)
			p.waitReconnect(before, transport)
			p.wait("the second node's name", fmt.Sprintf(`document.getElementById('f-node').textContent === %q`, second.Name))
			if log := p.logText(); !strings.Contains(log, "server_reconnect") {
				p.fatalf("the activity log does not show the server's reconnect hint")
			}
			p.waitAllTerminal()
			p.checkNewest(second.URL, token)
		})
	}
}
