package web_test

import (
	"fmt"
	"slices"
	"testing"

	"github.com/pushd/pushd/node"
)

// Two tabs of two tenants watch the same project and user names. Each sees
// its own tasks only, and a tab that asks for the other tenant's task by id
// is told it does not exist and is never shown it.
func TestTwoTenantsNeverSeeEachOthersTasks(t *testing.T) {
	n := startNode(t, node.Config{})
	b := newBrowser(t)
	for _, transport := range transports {
		t.Run(transport, func(t *testing.T) {
			acme, globex := b.tab(t), b.tab(t)
			acme.open(n.URL, "tenant=acme-"+transport+"&transport="+transport)
			globex.open(n.URL, "tenant=globex-"+transport+"&transport="+transport)
			for _, p := range []*page{acme, globex} {
				eval[bool](p, `(() => {
					window.__errors = [];
					window.pushdDemo.client.addEventListener('error', (e) => window.__errors.push(e.detail));
					return true;
				})()`)
			}

			var mine [2][]string
			for round := range 2 {
				for i, p := range []*page{acme, globex} {
					mine[i] = append(mine[i], p.start([]string{"text_to_video", "image_to_video"}[round], round == 1))
				}
			}
			// globex asks for acme's task, still running, by id.
			foreign := acme.start("text_to_video", false)
			mine[0] = append(mine[0], foreign)
			eval[bool](globex, fmt.Sprintf(`(window.pushdDemo.client.subscribe({tasks: [%q]}), true)`, foreign))
			globex.wait("not_found for the foreign task",
				fmt.Sprintf(`window.__errors.some((e) => e.code === 'not_found' && e.task_id === %q)`, foreign))

			for i, p := range []*page{acme, globex} {
				p.waitAllTerminal()
				var shown []string
				for _, c := range p.cards() {
					shown = append(shown, c.ID)
				}
				slices.Sort(shown)
				want := slices.Sorted(slices.Values(mine[i]))
				if !slices.Equal(shown, want) {
					p.fatalf("tab %d shows %v, want its own %v", i, shown, want)
				}
			}
			acme.waitStatus(foreign, "SUCCEEDED")
			if held := eval[bool](globex, fmt.Sprintf(`window.pushdDemo.client.task(%q) !== undefined`, foreign)); held {
				globex.fatalf("globex's client holds acme's task %s", foreign)
			}
			for _, s := range globex.seen(foreign) {
				globex.fatalf("globex rendered acme's task: %+v", s)
			}
		})
	}
}
