package web_test

import (
	"strconv"
	"strings"
	"testing"

	"github.com/pushd/pushd/node"
)

var transports = []string{"sse", "ws"}

// checkWalkShown checks what the page rendered for a task that succeeded:
// it started queued, passed through every stage, and its progress bar
// grew step by step to full.
func checkWalkShown(t *testing.T, p *page, task string) {
	t.Helper()
	history := p.seen(task)
	statuses := map[string]bool{}
	var widths []int
	for _, s := range history {
		statuses[s.Status] = true
		w, err := strconv.Atoi(strings.TrimSuffix(s.Width, "%"))
		if err != nil {
			p.fatalf("width %q of %s v%d", s.Width, task, s.Version)
		}
		if len(widths) > 0 && w < widths[len(widths)-1] {
			p.fatalf("the progress bar of %s went back: %v then %d", task, widths, w)
		}
		widths = append(widths, w)
	}
	if len(history) == 0 || history[0].Status != "QUEUED" || history[len(history)-1].Status != "SUCCEEDED" {
		p.fatalf("%s was shown as %+v, want QUEUED first and SUCCEEDED last", task, history)
	}
	for _, s := range []string{"RUNNING", "PROVIDER_SUBMITTED", "POST_PROCESSING"} {
		if !statuses[s] {
			p.fatalf("%s was never shown %s: %+v", task, s, history)
		}
	}
	moving := 0
	for i := 1; i < len(widths); i++ {
		if widths[i] > widths[i-1] && widths[i] < 100 {
			moving++
		}
	}
	if moving < 3 || widths[len(widths)-1] != 100 {
		p.fatalf("the progress bar of %s did not move step by step to 100%%: %v", task, widths)
	}
}

func TestStartedTaskRunsToSucceededOnScreen(t *testing.T) {
	base := startNode(t, node.Config{}).URL
	b := newBrowser(t)
	for _, transport := range transports {
		t.Run(transport, func(t *testing.T) {
			p := b.tab(t)
			p.open(base, "tenant=t-"+transport+"&transport="+transport)
			p.waitConn("streaming", transport)

			task := p.start("text_to_video", false)
			p.waitStatus(task, "SUCCEEDED")
			checkWalkShown(t, p, task)

			c := p.card(task)
			if c.Provider != "veo · veo-3" || c.Pct != "100%" || !strings.HasPrefix(c.Link, "/demo/assets/asset_"+task) {
				p.fatalf("finished card %+v", c)
			}
			if mode := eval[string](p, `document.getElementById('conn').dataset.serverMode`); mode != "push" {
				p.fatalf("server mode %q, want push", mode)
			}
			p.checkNewest(base, demoToken(t, base, "t-"+transport, "demo-user"))
		})
	}
}
