package docs

import (
	"fmt"
	"io/fs"
	"net/url"
	"path"
	"regexp"
	"strings"
	"unicode"
)

// The checker of the documents' references. It works on an fs.FS whose
// root is the repository's, so its tests run on small made-up trees.

// The design document, by its name and its path from the repository root
// (spelled in two parts: this file must not mention it itself).
const (
	designName = "DESIGN" + ".md"
	designDoc  = "docs/" + designName
	// workspace is the directory beside the repository that its documents
	// must not point at.
	workspace = "../" + "shared"
)

// checker finds the problems of a tree's documents. It caches the anchors
// of every markdown file it reads.
type checker struct {
	fsys    fs.FS
	anchors map[string]map[string]bool // by file: its GitHub-style anchors
	titles  map[string]map[string]bool // by file: its headings' text, lower case
}

func newChecker(fsys fs.FS) *checker {
	return &checker{fsys: fsys, anchors: map[string]map[string]bool{}, titles: map[string]map[string]bool{}}
}

// problem is one finding, printed as file:line: message.
type problem struct {
	file string
	line int
	msg  string
}

func (p problem) String() string { return fmt.Sprintf("%s:%d: %s", p.file, p.line, p.msg) }

var (
	// An inline link or image: [text](target "title"). The text may span
	// lines; nested brackets in it are not supported.
	inlineLink = regexp.MustCompile(`!?\[([^\]]*)\]\(\s*(<[^>]*>|[^\s)]*)(?:\s+(?:"[^"]*"|'[^']*'|\([^)]*\)))?\s*\)`)
	// A reference definition: [label]: target.
	refDef = regexp.MustCompile(`(?m)^ {0,3}\[([^\]]+)\]:[ \t]*(<[^>]*>|\S+)`)
	// A full or collapsed reference: [text][label], [label][].
	refUse = regexp.MustCompile(`\[([^\]]+)\]\[([^\]]*)\]`)
	// An absolute URL anywhere in the prose: GitHub links bare ones too.
	absURL = regexp.MustCompile("(?i)\\b(?:https?|wss?)://[^\\s<>()\\[\\]\"'`]+")
	// "issue", then a number: issue numbers mean nothing to a reader of
	// the repository alone.
	issueWord = regexp.MustCompile(`(?i)\bissues?(?:\s+#?|#)\d+`)
	// '#' and a number in prose, GitHub's issue reference.
	issueRef = regexp.MustCompile(`(?m)(?:^|[\s(\[,;])#\d+(?:$|[^\w-])`)
	// GitHub's line anchors, valid on any file.
	lineAnchor = regexp.MustCompile(`^L\d+(?:-L\d+)?$`)

	atxHeading    = regexp.MustCompile(`^ {0,3}(#{1,6})(?:[ \t]+(.*?))?(?:[ \t]+#+)?[ \t]*$`)
	setextLine    = regexp.MustCompile(`^ {0,3}(=+|-+)[ \t]*$`)
	htmlAnchor    = regexp.MustCompile(`<a\s+(?:[^>]*\s)?(?:id|name)="([^"]+)"`)
	fenceOpen     = regexp.MustCompile("^[ \t]*(`{3,}|~{3,})")
	headingInline = regexp.MustCompile(`!?\[([^\]]*)\]\([^)]*\)`)
	htmlTag       = regexp.MustCompile(`<[^>]+>`)
)

// markdown checks one markdown file: its links, its anchors, and the text
// rules every file follows (mentions).
func (c *checker) markdown(name string) []problem {
	b, err := fs.ReadFile(c.fsys, name)
	if err != nil {
		return []problem{{name, 0, err.Error()}}
	}
	raw := string(b)
	text := prose(raw)
	var out []problem
	at := func(off int) int { return strings.Count(text[:off], "\n") + 1 }

	for _, m := range inlineLink.FindAllStringSubmatchIndex(text, -1) {
		target := strings.Trim(text[m[4]:m[5]], "<>")
		out = append(out, c.target(name, at(m[0]), target)...)
	}
	defined := map[string]bool{}
	for _, m := range refDef.FindAllStringSubmatchIndex(text, -1) {
		defined[label(text[m[2]:m[3]])] = true
		out = append(out, c.target(name, at(m[0]), strings.Trim(text[m[4]:m[5]], "<>"))...)
	}
	for _, m := range refUse.FindAllStringSubmatchIndex(text, -1) {
		l := text[m[4]:m[5]]
		if l == "" {
			l = text[m[2]:m[3]]
		}
		if !defined[label(l)] {
			out = append(out, problem{name, at(m[0]), fmt.Sprintf("reference [%s] has no definition", l)})
		}
	}
	for _, m := range absURL.FindAllStringIndex(text, -1) {
		if u := text[m[0]:m[1]]; !local(u) {
			out = append(out, problem{name, at(m[0]), "links outside the repository: " + u})
		}
	}
	for _, m := range issueRef.FindAllStringIndex(text, -1) {
		out = append(out, problem{name, at(m[0]), "an issue reference: " + strings.TrimSpace(text[m[0]:m[1]])})
	}
	// The mentions are checked on the raw text, code included, except the
	// text of links to a section of the design, which the link itself
	// names.
	return append(out, c.mentions(name, blankDesignLinkText(raw))...)
}

// target checks one link target of file name.
func (c *checker) target(name string, line int, target string) []problem {
	bad := func(msg string) []problem { return []problem{{name, line, msg + ": " + target}} }
	if target == "" {
		return []problem{{name, line, "an empty link"}}
	}
	if u, err := url.Parse(target); err == nil && u.Scheme != "" {
		switch strings.ToLower(u.Scheme) {
		case "http", "https", "ws", "wss":
			return nil // the prose scan checks every absolute URL
		}
		return bad("links outside the repository")
	}
	p, anchor, _ := strings.Cut(target, "#")
	p, _, _ = strings.Cut(p, "?")
	p, err := url.PathUnescape(p)
	if err != nil {
		return bad("a link that does not decode")
	}
	file := name
	if p != "" {
		if strings.HasPrefix(p, "/") {
			return bad("a rooted link; make it relative to the file")
		}
		file = path.Join(path.Dir(name), p)
		if file == ".." || strings.HasPrefix(file, "../") {
			return bad("links outside the repository")
		}
		if _, err := fs.Stat(c.fsys, file); err != nil {
			return bad("links to a path that does not exist")
		}
	}
	switch {
	case anchor == "":
		return nil
	case strings.HasSuffix(file, ".md"):
		if !c.anchorsOf(file)[anchor] {
			return bad("an anchor with no heading in " + file)
		}
	case !lineAnchor.MatchString(anchor):
		return bad("an anchor into a file that is not markdown")
	}
	return nil
}

// mentions checks the rules every document and source file follows: no
// mention of the workspace outside the repository, no issue numbers, and
// every mention of the design document names a section of it: its path,
// a comma and the section's title in double quotes, or its path and
// '#' and the section's anchor (in markdown, a link to the anchor).
func (c *checker) mentions(name, text string) []problem {
	var out []problem
	at := func(off int) int { return strings.Count(text[:off], "\n") + 1 }
	for _, m := range issueWord.FindAllStringIndex(text, -1) {
		out = append(out, problem{name, at(m[0]), "an issue number: " + text[m[0]:m[1]]})
	}
	if i := strings.Index(text, workspace); i >= 0 {
		out = append(out, problem{name, at(i), "mentions " + workspace + ", which is not part of the repository"})
	}
	const doc = designName
	for off := 0; ; {
		i := strings.Index(text[off:], doc)
		if i < 0 {
			break
		}
		i += off
		off = i + len(doc)
		if msg := c.designMention(name, text[:i], text[off:]); msg != "" {
			out = append(out, problem{name, at(i), msg})
		}
	}
	return out
}

// designMention checks one mention of the design document, given the text
// before and after it; it returns what is wrong, or "".
func (c *checker) designMention(name, before, after string) string {
	const form = "name a section: " + designDoc + `, "Section" or ` + designName + "#anchor"
	if _, err := fs.Stat(c.fsys, designDoc); err != nil {
		return "mentions " + designDoc + ", which does not exist"
	}
	if rest, ok := strings.CutPrefix(after, "#"); ok {
		end := strings.IndexFunc(rest, func(r rune) bool {
			return !(unicode.IsLetter(r) || unicode.IsNumber(r) || r == '-' || r == '_')
		})
		if end < 0 {
			end = len(rest)
		}
		if !c.anchorsOf(designDoc)[rest[:end]] {
			return fmt.Sprintf("%s#%s: no such section in %s", designName, rest[:end], designDoc)
		}
		// In markdown the link checker resolves the path; elsewhere it
		// must be the repository's.
		if !strings.HasSuffix(name, ".md") && !strings.HasSuffix(before, "docs/") {
			return "mentions " + designName + " without its path: " + form
		}
		return ""
	}
	// In markdown a link to the whole document is fine: its text or its
	// target, which the link checker resolves.
	if strings.HasSuffix(name, ".md") && (strings.HasPrefix(after, "](") || strings.HasPrefix(after, ")")) {
		return ""
	}
	if !strings.HasSuffix(before, "docs/") {
		return "mentions " + designName + " without its path: " + form
	}
	// The title may start on the next line of a comment.
	rest, ok := strings.CutPrefix(after, ",")
	if rest = strings.TrimLeft(rest, " \t\r\n/*#"); !ok || !strings.HasPrefix(rest, `"`) {
		return "mentions " + designDoc + " without a section: " + form
	}
	rest = rest[1:]
	title, _, ok := strings.Cut(rest, `"`)
	if !ok || strings.Contains(title, "\n") {
		return "mentions " + designDoc + " without a section: " + form
	}
	if !c.titlesOf(designDoc)[strings.ToLower(title)] {
		return fmt.Sprintf("%s has no section %q", designDoc, title)
	}
	return ""
}

// blankDesignLinkText blanks the text of markdown links to a section of
// the design document, keeping newlines: such a link names the section by
// its target, whatever its text says.
func blankDesignLinkText(text string) string {
	b := []byte(text)
	for _, m := range inlineLink.FindAllStringSubmatchIndex(text, -1) {
		if strings.Contains(text[m[4]:m[5]], designName+"#") {
			blank(b, m[2], m[3])
		}
	}
	return string(b)
}

// anchorsOf returns the anchors of a markdown file: its headings' slugs
// (a repeated one gets -1, -2, ... as on GitHub) and explicit <a id>s.
func (c *checker) anchorsOf(file string) map[string]bool {
	if a, ok := c.anchors[file]; ok {
		return a
	}
	anchors, titles := map[string]bool{}, map[string]bool{}
	if b, err := fs.ReadFile(c.fsys, file); err == nil {
		seen := map[string]int{}
		for _, h := range headings(string(b)) {
			s := slug(h)
			if n := seen[s]; n > 0 {
				anchors[fmt.Sprintf("%s-%d", s, n)] = true
			} else {
				anchors[s] = true
			}
			seen[s]++
			titles[strings.ToLower(plain(h))] = true
		}
		for _, m := range htmlAnchor.FindAllStringSubmatch(prose(string(b)), -1) {
			anchors[m[1]] = true
		}
	}
	c.anchors[file], c.titles[file] = anchors, titles
	return anchors
}

// titlesOf returns the headings' text of a markdown file, in lower case.
func (c *checker) titlesOf(file string) map[string]bool {
	c.anchorsOf(file)
	return c.titles[file]
}

// headings returns the text of a markdown document's headings, ATX and
// setext, outside code blocks.
func headings(doc string) []string {
	var out []string
	lines := strings.Split(prose(doc), "\n")
	rawLines := strings.Split(doc, "\n") // the same lines, code spans kept
	for i, l := range lines {
		if m := atxHeading.FindStringSubmatch(l); m != nil {
			out = append(out, headingText(rawLines[i]))
			continue
		}
		if i > 0 && setextLine.MatchString(l) && strings.TrimSpace(lines[i-1]) != "" &&
			atxHeading.FindStringSubmatch(lines[i-1]) == nil {
			out = append(out, strings.TrimSpace(rawLines[i-1]))
		}
	}
	return out
}

// headingText is an ATX heading line's text.
func headingText(line string) string {
	m := atxHeading.FindStringSubmatch(line)
	if m == nil {
		return ""
	}
	return m[2]
}

// plain is a heading's text as GitHub renders it, without markup: code
// spans keep their content, links their text.
func plain(h string) string {
	h = headingInline.ReplaceAllString(h, "$1")
	h = htmlTag.ReplaceAllString(h, "")
	h = strings.NewReplacer("`", "", "*", "").Replace(h)
	return strings.TrimSpace(h)
}

// slug is GitHub's anchor for a heading: lower case, letters, digits, '-'
// and '_' kept, spaces made '-', everything else dropped.
func slug(h string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(plain(h)) {
		switch {
		case unicode.IsLetter(r), unicode.IsNumber(r), r == '-', r == '_':
			b.WriteRune(r)
		case r == ' ':
			b.WriteByte('-')
		}
	}
	return b.String()
}

// label is a reference label as markdown matches it: case and runs of
// white space do not matter.
func label(l string) string { return strings.ToLower(strings.Join(strings.Fields(l), " ")) }

// local reports whether an absolute URL is an example on this machine.
func local(raw string) bool {
	u, err := url.Parse(strings.TrimRight(raw, ".,;:"))
	if err != nil {
		return false
	}
	switch u.Hostname() {
	case "localhost", "127.0.0.1", "::1":
		return true
	}
	return false
}

// prose returns doc with its code blanked, fenced blocks and code spans,
// keeping every newline, so offsets keep their line numbers.
func prose(doc string) string {
	b := []byte(doc)
	// Fenced blocks: a fence of three or more backticks or tildes, closed
	// by a fence of the same character at least as long, or the end.
	var fence string
	start := 0
	for off := 0; off < len(b); {
		end := strings.IndexByte(doc[off:], '\n')
		if end < 0 {
			end = len(doc)
		} else {
			end += off
		}
		line := doc[off:end]
		if fence == "" {
			if m := fenceOpen.FindStringSubmatch(line); m != nil {
				fence, start = m[1], off
			}
		} else if t := strings.TrimSpace(line); strings.HasPrefix(t, fence) && strings.Trim(t, fence[:1]) == "" {
			blank(b, start, end)
			fence = ""
		}
		off = end + 1
	}
	if fence != "" {
		blank(b, start, len(b))
	}
	// Code spans: a run of n backticks up to the next run of exactly n,
	// within a paragraph; an unmatched run is literal.
	s := string(b)
	for i := 0; i < len(s); {
		if s[i] != '`' {
			i++
			continue
		}
		n := 1
		for i+n < len(s) && s[i+n] == '`' {
			n++
		}
		par := len(s)
		if p := strings.Index(s[i:], "\n\n"); p >= 0 {
			par = i + p
		}
		closeAt := -1
		for j := i + n; j < par; {
			if s[j] != '`' {
				j++
				continue
			}
			k := 1
			for j+k < par && s[j+k] == '`' {
				k++
			}
			if k == n {
				closeAt = j + k
				break
			}
			j += k
		}
		if closeAt < 0 {
			i += n
			continue
		}
		blank(b, i, closeAt)
		i = closeAt
	}
	return string(b)
}

// blank replaces b[from:to] with spaces, keeping newlines.
func blank(b []byte, from, to int) {
	for i := from; i < to; i++ {
		if b[i] != '\n' {
			b[i] = ' '
		}
	}
}
