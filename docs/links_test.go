package docs

import (
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
	"testing"
	"testing/fstest"
)

// root is the repository, seen from this package's directory.
const root = ".."

// TestDocumentLinks checks README.md and every docs/**/*.md: each relative
// link resolves to a path inside the repository, each anchor to a heading,
// nothing links to the web (local examples aside), and the text names no
// issue numbers, no path of the workspace around the repository, and no
// section of the design document that does not exist.
func TestDocumentLinks(t *testing.T) {
	fsys := repo(t)
	files := []string{"README.md"}
	err := fs.WalkDir(fsys, "docs", func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() && strings.HasSuffix(p, ".md") {
			files = append(files, p)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(files) < 2 {
		t.Fatalf("found only %v: not the repository's documents", files)
	}
	c := newChecker(fsys)
	for _, f := range files {
		for _, p := range c.markdown(f) {
			t.Error(p)
		}
	}
}

// TestSourceMentions checks the comments and strings of the code the same
// way: no issue numbers, no path of the workspace, and every mention of
// the design document names one of its sections.
func TestSourceMentions(t *testing.T) {
	fsys := repo(t)
	c := newChecker(fsys)
	n := 0
	err := fs.WalkDir(fsys, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if p != "." && strings.HasPrefix(d.Name(), ".") {
				return fs.SkipDir
			}
			return nil
		}
		switch path.Ext(p) {
		case ".go", ".js", ".ts":
		default:
			return nil
		}
		b, err := fs.ReadFile(fsys, p)
		if err != nil {
			return err
		}
		n++
		for _, pr := range c.mentions(p, string(b)) {
			t.Error(pr)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if n < 100 {
		t.Fatalf("checked only %d source files: not the repository", n)
	}
}

func repo(t *testing.T) fs.FS {
	t.Helper()
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Fatalf("the repository root is not %s: %v", root, err)
	}
	return os.DirFS(root)
}

// Words the checker refuses, spelled so that this file does not hold them.
var (
	design   = "DESIGN" + ".md"
	issueNum = "issue" + " 12"
	hashRef  = "#" + "12"
)

// TestCheckerFindsProblems shows that the checker fails on each kind of bad
// input, and passes the good ones, on small made-up trees.
func TestCheckerFindsProblems(t *testing.T) {
	designText := "# Design\n\n## Key names\n\n## Failure modes\n\n## Failure modes\n\n### `POST /v1/publish`\n"
	tests := []struct {
		name string
		file string // checked; markdown with markdown's rules, else as source
		text string
		want string // a problem's substring; "" means none
	}{
		{"relative link", "README.md", "see [config](docs/CONFIG.md) and [tree](docs)", ""},
		{"missing file", "README.md", "see [x](docs/NOPE.md)", "does not exist"},
		{"outside the root", "docs/A.md", "see [x](../../etc/passwd)", "outside the repository"},
		{"rooted path", "README.md", "see [x](/docs/CONFIG.md)", "rooted"},
		{"empty link", "README.md", "see [x]()", "empty link"},
		{"web link", "README.md", "see [go](https://go.dev/doc/)", "outside the repository"},
		{"autolink", "README.md", "see <https://example.com/x>", "outside the repository"},
		{"bare URL", "docs/A.md", "see http://example.com for more", "outside the repository"},
		{"mailto", "README.md", "write to [us](mailto:a@example.com)", "outside the repository"},
		{"local examples", "README.md", "open <http://localhost:8080/demo/> or [this](http://127.0.0.1:6379)", ""},
		{"links in code are not links", "README.md", "```\n[x](nope.md) https://example.com\n```\n`[y](nope.md)`", ""},
		{"code span over two lines", "README.md", "a `b\n[x](nope.md)` c", ""},
		{"unclosed fence hides the rest", "README.md", "```sh\n[x](nope.md)\n", ""},
		{"reference definition", "README.md", "see [x][cfg]\n\n[cfg]: docs/CONFIG.md", ""},
		{"reference to a missing file", "README.md", "see [x][cfg]\n\n[cfg]: docs/GONE.md", "does not exist"},
		{"undefined reference", "README.md", "see [x][nowhere]", "no definition"},
		{"anchor in the same file", "docs/A.md", "# Top\n\n## Two words\n\nsee [x](#two-words) and [y](#top)", ""},
		{"missing anchor", "docs/A.md", "# Top\n\nsee [x](#bottom)", "no heading"},
		{"anchor in another file", "README.md", "see [x](docs/" + design + "#key-names), [y](docs/" + design + "#failure-modes-1), [z](docs/" + design + "#post-v1publish)", ""},
		{"missing anchor in another file", "README.md", "see [x](docs/" + design + "#redis-keys)", "no heading in docs/" + design},
		{"heading in code is no anchor", "docs/A.md", "```\n# Fake\n```\nsee [x](#fake)", "no heading"},
		{"anchor into a non-markdown file", "README.md", "see [x](go.mod#module)", "not markdown"},
		{"line anchor", "README.md", "see [x](go.mod#L1)", ""},
		{"setext heading", "docs/A.md", "Title here\n==========\n\nsee [x](#title-here)", ""},
		{"issue number", "README.md", "fixed in " + issueNum + ".", "issue number"},
		{"issue reference", "README.md", "fixed by " + hashRef + ".", "issue reference"},
		{"numbered anchor is no issue", "docs/A.md", "## 2. Two\n\nsee [x](#" + "2-two)", ""},
		{"the workspace", "README.md", "read " + workspace + "/NOTES for this", "not part of the repository"},
		{"design link", "docs/A.md", "as [" + design + ", Key names](" + design + "#key-names) says", ""},
		{"design link to no section", "docs/A.md", "as [the design](" + design + "#nope) says", "no such section"},
		{"design named without section", "docs/A.md", "as docs/" + design + " says", "without a section"},
		{"design linked as a whole", "README.md", "see [docs/" + design + "](docs/" + design + ")", ""},
		{"source: design linked as a whole is no link", "x/x.go", "// see (docs/" + design + ")", "without a section"},
		{"source: design section", "x/x.go", "// see docs/" + design + `, "Failure modes".`, ""},
		{"source: design section by anchor", "x/x.go", "// see docs/" + design + "#key-names.", ""},
		{"source: design without section", "x/x.go", "// the names of " + design + ".", "without its path"},
		{"source: design without path", "x/x.go", "// " + design + `, "Key names"`, "without its path"},
		{"source: design section on the next line", "x/x.go", "// see docs/" + design + ",\n\t// \"Key names\".", ""},
		{"source: design with no such section", "x/x.go", "// docs/" + design + `, "Redis keys"`, "no section"},
		{"source: issue number", "x/x.js", "// see " + issueNum, "issue number"},
		{"source: the workspace", "x/x.go", "// read " + workspace + "/x", "not part of the repository"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fsys := fstest.MapFS{
				"go.mod":         {Data: []byte("module x\n")},
				"docs/CONFIG.md": {Data: []byte("# Configuration\n")},
				"docs/" + design: {Data: []byte(designText)},
				tt.file:          {Data: []byte(tt.text)},
			}
			c := newChecker(fsys)
			var got []problem
			if strings.HasSuffix(tt.file, ".md") {
				got = c.markdown(tt.file)
			} else {
				got = c.mentions(tt.file, tt.text)
			}
			if tt.want == "" {
				for _, p := range got {
					t.Errorf("unexpected problem: %s", p)
				}
				return
			}
			for _, p := range got {
				if strings.Contains(p.msg, tt.want) {
					return
				}
			}
			t.Errorf("no problem containing %q; got %v", tt.want, got)
		})
	}
}

// TestSlug pins GitHub's anchors for the kinds of headings the documents
// use.
func TestSlug(t *testing.T) {
	for h, want := range map[string]string{
		"Principles":                               "principles",
		"One update, end to end":                   "one-update-end-to-end",
		"POST /v1/publish":                         "post-v1publish",
		"2. Redis Cluster":                         "2-redis-cluster",
		"Streams (with `--streams`)":               "streams-with---streams",
		"Memory per task snapshot (*estimate*)":    "memory-per-task-snapshot-estimate",
		"Client addresses behind a proxy: `--x-y`": "client-addresses-behind-a-proxy---x-y",
		"Publishing (the Task State Service side)": "publishing-the-task-state-service-side",
		"[Linked](x.md) snake_case":                "linked-snake_case",
	} {
		if got := slug(h); got != want {
			t.Errorf("slug(%q) = %q, want %q", h, got, want)
		}
	}
}
