package main

import (
	"context"
	"encoding/json"
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
// committing each with the version guard, then publishing it through
// POST /v1/publish, or (Python, with redis-py) straight to Redis through
// the write script, to a node that does not read the changes; or
// committing the row alone, for a node that does. A browser watching the
// task from before it exists sees every version, in order, the last with
// its output_url. Without the reader, a writer's publish that did nothing
// would show only the newest version, a repair round later.
func TestWriterExamples(t *testing.T) {
	for _, tool := range []string{debianPython, "node", "npm"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("the test needs %s (scripts/test installs it): %v", tool, err)
		}
	}
	r := testenv.SharedRedis(t)
	pg := testenv.Database(t)
	const apiKey = "writer-key"
	// Two fleets of one node, apart by their key prefixes.
	reader := startBinary(t, "--redis-url", r.URL, "--key-prefix", r.Names.Prefix, "--database-url", pg.URL,
		"--jwt-secret", fleetSecret, "--api-key", apiKey, "--read-changes")
	plainPrefix := r.Names.Prefix + "plain:"
	plain := startBinary(t, "--redis-url", r.URL, "--key-prefix", plainPrefix, "--database-url", pg.URL,
		"--jwt-secret", fleetSecret, "--api-key", apiKey)
	testenv.Eventually(t, "the node reads the changes", func() bool {
		return testenv.Scrape(t, reader.AdminURL)["pushd_change_reader_leading"] == 1
	})
	python, err := filepath.Abs("../../examples/writers/python/writer.py")
	if err != nil {
		t.Fatal(err)
	}
	nodeDir := installNodeWriter(t)

	// Each writer's ways to publish: POST /v1/publish, straight to Redis
	// through the write script (Python, with redis-py), and the row alone.
	// The Redis writer gets no pushd URL that answers.
	viaAPI := []string{"PUSHD_URL=" + plain.URL}
	viaRedis := []string{"PUSHD_URL=http://127.0.0.1:1", "REDIS_URL=" + r.URL, "KEY_PREFIX=" + plainPrefix}
	rowOnly := []string{"PUSHD_URL=http://127.0.0.1:1", "ROW_ONLY=1"}
	for _, w := range []struct {
		name string
		dir  string
		cmd  []string
		env  []string
		node *proc
	}{
		{"python/publish_api", t.TempDir(), []string{debianPython, python}, viaAPI, plain},
		{"python/redis", t.TempDir(), []string{debianPython, python}, viaRedis, plain},
		{"python/row_only", t.TempDir(), []string{debianPython, python}, rowOnly, reader},
		{"node/publish_api", nodeDir, []string{"node", "writer.mjs"}, viaAPI, plain},
		{"node/row_only", nodeDir, []string{"node", "writer.mjs"}, rowOnly, reader},
	} {
		t.Run(w.name, func(t *testing.T) {
			tenant, task := testenv.UniqueID("t"), testenv.UniqueID("task")
			sse := openSSE(t, w.node.URL, "/v1/events?task="+task, fleetToken(t, tenant))
			sse.NextOf(t, "hello")
			ctx, cancel := context.WithTimeout(context.Background(), waitFor)
			defer cancel()
			cmd := exec.CommandContext(ctx, w.cmd[0], w.cmd[1:]...)
			cmd.Dir = w.dir
			cmd.Env = append(append(os.Environ(), "DATABASE_URL="+pg.URL, "PUSHD_API_KEY="+apiKey,
				"TASK_ID="+task, "TENANT_ID="+tenant, "PROJECT_ID=p1", "USER_ID=u1", "STEP_MS=100"), w.env...)
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

// debianPython is the Python whose packages scripts/test installs from
// Debian (python3-psycopg, python3-redis): a python3 earlier on PATH may
// lack them.
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
