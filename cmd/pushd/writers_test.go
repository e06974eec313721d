package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pushd/pushd/internal/testenv"
)

// The Task State Service's writers of examples/writers, in Python
// (psycopg) and Node.js (pg from npm), each move a task through twelve
// versions, QUEUED, RUNNING 10 % to 100 %, SUCCEEDED with an output URL,
// committing each with the version guard: once publishing each through
// POST /v1/publish, once committing the row alone for a node that reads
// the changes. A browser watching the task from before it exists sees
// every version, in order, the last with its output_url.
func TestWriterExamples(t *testing.T) {
	for _, tool := range []string{debianPython, "node", "npm"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("the test needs %s (scripts/test installs it): %v", tool, err)
		}
	}
	r := testenv.SharedRedis(t)
	pg := testenv.Database(t)
	const apiKey = "writer-key"
	n := startBinary(t, "--redis-url", r.URL, "--key-prefix", r.Names.Prefix, "--database-url", pg.URL,
		"--jwt-secret", fleetSecret, "--api-key", apiKey, "--read-changes")
	testenv.Eventually(t, "the node reads the changes", func() bool {
		return testenv.Scrape(t, n.AdminURL)["pushd_change_reader_leading"] == 1
	})
	python, err := filepath.Abs("../../examples/writers/python/writer.py")
	if err != nil {
		t.Fatal(err)
	}
	nodeDir := installNodeWriter(t)

	for _, w := range []struct {
		name string
		dir  string
		cmd  []string
	}{
		{"python", t.TempDir(), []string{debianPython, python}},
		{"node", nodeDir, []string{"node", "writer.mjs"}},
	} {
		for _, rowOnly := range []string{"0", "1"} {
			t.Run(fmt.Sprintf("%s/row_only=%s", w.name, rowOnly), func(t *testing.T) {
				tenant, task := testenv.UniqueID("t"), testenv.UniqueID("task")
				sse := openSSE(t, n.URL, "/v1/events?task="+task, fleetToken(t, tenant))
				sse.NextOf(t, "hello")
				ctx, cancel := context.WithTimeout(context.Background(), waitFor)
				defer cancel()
				cmd := exec.CommandContext(ctx, w.cmd[0], w.cmd[1:]...)
				cmd.Dir = w.dir
				cmd.Env = append(os.Environ(), "DATABASE_URL="+pg.URL, "PUSHD_URL="+n.URL, "PUSHD_API_KEY="+apiKey,
					"TASK_ID="+task, "TENANT_ID="+tenant, "PROJECT_ID=p1", "USER_ID=u1", "STEP_MS=100", "ROW_ONLY="+rowOnly)
				if out, err := cmd.CombinedOutput(); err != nil {
					t.Fatalf("%v: %v\n%s", w.cmd, err, out)
				}
				for want := int64(1); want <= 12; want++ {
					var doc struct {
						Version   int64  `json:"version"`
						Status    string `json:"status"`
						Progress  int    `json:"progress"`
						OutputURL string `json:"output_url"`
					}
					ev := sse.Next(t)
					if ev.Event == "error" && want == 1 && strings.Contains(ev.Data, `"not_found"`) {
						ev = sse.Next(t) // watched before it existed: it stays watched
					}
					if ev.Event != "task" {
						t.Fatalf("event %q (%s), want the task's v%d", ev.Event, ev.Data, want)
					}
					if err := json.Unmarshal([]byte(ev.Data), &doc); err != nil {
						t.Fatal(err)
					}
					if doc.Version != want {
						t.Fatalf("v%d after v%d: want every version in order", doc.Version, want-1)
					}
					if want == 12 && (doc.Status != "SUCCEEDED" || doc.Progress != 100 || !strings.HasSuffix(doc.OutputURL, task+".mp4")) {
						t.Errorf("the last version: %+v, want SUCCEEDED at 100 %% with its output_url", doc)
					}
				}
			})
		}
	}
}

// debianPython is the Python whose packages scripts/test installs from
// Debian (python3-psycopg): a python3 earlier on PATH may lack them.
const debianPython = "/usr/bin/python3"

// installNodeWriter copies the Node.js writer into a directory of the
// test's own and installs its dependencies there with npm, as its README
// says; the repository's copy stays without node_modules.
func installNodeWriter(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	for _, name := range []string{"package.json", "writer.mjs"} {
		b, err := os.ReadFile(filepath.Join("../../examples/writers/node", name))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*waitFor)
	defer cancel()
	cmd := exec.CommandContext(ctx, "npm", "install", "--no-audit", "--no-fund")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "npm_config_update_notifier=false", "npm_config_loglevel=warn")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("npm install: %v\n%s", err, out)
	}
	return dir
}
