package web_test

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/pushd/pushd/node"
)

// The demo page with tasks in several states, on a desktop and on a phone,
// saved for a person to look at (go test -artifacts keeps them; the paths
// are logged). On a phone the page must not scroll sideways.
func TestScreenshotsOfTheDemoPage(t *testing.T) {
	// Slower steps, so tasks can be caught mid-way.
	n := startNode(t, node.Config{}, node.ForTest(node.TestTuning{DemoStep: 400 * time.Millisecond}))
	b := newBrowser(t)
	p := b.tab(t)
	p.do("desktop viewport", chromedp.EmulateViewport(1280, 860))
	p.open(n.URL, "tenant=acme&user=maya")

	ok := p.start("text_to_video", false)
	failed := p.start("image_to_video", true)
	p.waitStatus(ok, "SUCCEEDED")
	p.waitStatus(failed, "FAILED")
	eval[bool](p, `(document.getElementById('prompt').value = 'A hummingbird hovering over a neon flower, macro, slow motion', true)`)
	running := p.start("image_to_video", false)
	p.waitStatus(running, "PROVIDER_SUBMITTED")
	eval[bool](p, `(document.getElementById('prompt').value = 'Drone shot over a foggy pine forest at sunrise', true)`)
	queued := p.start("text_to_video", false)
	p.wait("a queue position shown", fmt.Sprintf(`document.querySelector('[data-task-id=%q] .queue').textContent.includes('in queue')`, queued))
	// The finished task's output image has loaded, and the new card's
	// entrance animation is over, so the shot shows them as a person would.
	p.wait("the output image", fmt.Sprintf(`document.querySelector('[data-task-id=%q] .thumb img')?.complete`, ok))
	p.wait("the new card settled", fmt.Sprintf(`document.querySelector('[data-task-id=%q]').getAnimations().length === 0`, queued))

	dir := t.ArtifactDir()
	shoot := func(name string, shot chromedp.Action[[]byte]) {
		t.Helper()
		png, err := chromedp.Run(p.ctx, shot)
		if err != nil {
			p.fatalf("screenshot %s: %v", name, err)
		}
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, png, 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("screenshot: %s", path)
	}
	shoot("demo-desktop.png", chromedp.FullScreenshot(100)) // 100: PNG; less is JPEG
	// Two columns: the connection panel beside the project, not below it.
	if side := eval[bool](p, `document.getElementById('conn').getBoundingClientRect().left > document.getElementById('tasks').getBoundingClientRect().right`); !side {
		p.fatalf("on a desktop the connection panel is not beside the project")
	}

	p.do("phone viewport", chromedp.EmulateViewport(390, 844, chromedp.EmulateScale(2), chromedp.EmulateMobile))
	p.wait("the phone layout", `window.innerWidth === 390`)
	if over := eval[int](p, `document.documentElement.scrollWidth - window.innerWidth`); over > 0 {
		p.fatalf("on a 390px wide screen the page is %dpx too wide", over)
	}
	// One column, the project first: the connection panel comes below the
	// last card.
	if gap := eval[int](p, `(() => {
		const tasks = document.getElementById('tasks').getBoundingClientRect();
		const conn = document.getElementById('conn').getBoundingClientRect();
		return Math.round(conn.top - tasks.bottom);
	})()`); gap < 0 {
		p.fatalf("on a phone the connection panel starts %dpx above the end of the project", -gap)
	}
	shoot("demo-phone.png", chromedp.FullScreenshot(100))
}
