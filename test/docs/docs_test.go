package docs

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"unicode"
)

// repoRoot is the repository's root, from this package's directory.
const repoRoot = "../.."

func read(t *testing.T, name string) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(repoRoot, name))
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

// apache20 is the SHA-256 of the Apache License 2.0 as Kubernetes'
// repositories ship it (k8s.io/api's LICENSE, the text of
// apache.org/licenses/LICENSE-2.0.txt with its appendix).
const apache20 = "cfc7749b96f63bd31c3c42b5c471bf756814053e847c10f3eb003417bc523d30"

func TestLicenseIsTheApacheLicense20AsKubernetesShipsIt(t *testing.T) {
	sum := sha256.Sum256([]byte(read(t, "LICENSE")))
	if got := hex.EncodeToString(sum[:]); got != apache20 {
		t.Errorf("LICENSE: sha256 %s, want %s (the Apache License 2.0 as in k8s.io/api's LICENSE, unchanged)", got, apache20)
	}
}

func TestChangelogStartsWithAnUnreleasedSection(t *testing.T) {
	text := read(t, "CHANGELOG.md")
	if !strings.HasPrefix(text, "# Changelog\n") {
		t.Errorf("CHANGELOG.md does not start with \"# Changelog\"")
	}
	first := regexp.MustCompile(`(?m)^## .*$`).FindString(text)
	if first != "## Unreleased" {
		t.Errorf("CHANGELOG.md's first section is %q, want \"## Unreleased\" (changes not yet released go there, on top)", first)
	}
}

func TestSecurityPolicyPointsAtTheThreatModelAndSaysHowToReport(t *testing.T) {
	text := read(t, "SECURITY.md")
	for _, want := range []string{"(docs/security.md)", "## Reporting a vulnerability", "privately", "security/advisories/new"} {
		if !strings.Contains(text, want) {
			t.Errorf("SECURITY.md lacks %q", want)
		}
	}
}

// readmeLines bounds README.md: what an operator reads in five minutes
// (what kp is, install, replacing kube-proxy, rollback, the command line,
// troubleshooting, the two developer commands); the rest is in docs/.
const readmeLines = 250

func TestReadmeIsShortAndSendsTheRestToDocs(t *testing.T) {
	text := read(t, "README.md")
	if n := strings.Count(text, "\n"); n > readmeLines {
		t.Errorf("README.md has %d lines, want at most %d: move the detail into docs/ and link it", n, readmeLines)
	}
	for _, section := range []string{"## Install", "## Replacing kube-proxy", "## Rollback and uninstall", "## The command line",
		"## Troubleshooting", "## Developing", "make demo", "make test"} {
		if !strings.Contains(text, section) {
			t.Errorf("README.md lacks %q", section)
		}
	}
	docs, err := filepath.Glob(filepath.Join(repoRoot, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range docs {
		if link := "(docs/" + filepath.Base(d) + ")"; !strings.Contains(text, link) {
			t.Errorf("README.md does not link %s: every page of docs/ is reached from it", link)
		}
	}
}

// documents are the Markdown files whose links are checked: the top-level
// ones (README.md, CHANGELOG.md, SECURITY.md) and docs/.
func documents(t *testing.T) []string {
	t.Helper()
	var docs []string
	for _, pattern := range []string{"*.md", "docs/*.md"} {
		m, err := filepath.Glob(filepath.Join(repoRoot, pattern))
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range m {
			rel, err := filepath.Rel(repoRoot, f)
			if err != nil {
				t.Fatal(err)
			}
			docs = append(docs, filepath.ToSlash(rel))
		}
	}
	if len(docs) < 3 {
		t.Fatalf("found only %v", docs)
	}
	return docs
}

var (
	linkRE     = regexp.MustCompile(`\]\(([^)\s]+)\)`)
	codeSpanRE = regexp.MustCompile("`[^`]*`")
)

// links returns the targets of a Markdown file's inline links, outside code
// blocks and code spans, each with its line number.
func links(text string) (targets []string, lines []int) {
	fenced := false
	sc := bufio.NewScanner(strings.NewReader(text))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			fenced = !fenced
			continue
		}
		if fenced {
			continue
		}
		for _, m := range linkRE.FindAllStringSubmatch(codeSpanRE.ReplaceAllString(line, ""), -1) {
			targets = append(targets, m[1])
			lines = append(lines, n)
		}
	}
	return targets, lines
}

// anchors returns the anchors GitHub gives a Markdown file's headings: the
// heading's text in lower case, without punctuation other than '-' and '_',
// spaces turned into '-', a repeat suffixed -1, -2, ...
func anchors(text string) map[string]bool {
	seen := map[string]int{}
	out := map[string]bool{}
	fenced := false
	for _, line := range strings.Split(text, "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			fenced = !fenced
			continue
		}
		if fenced || !strings.HasPrefix(line, "#") {
			continue
		}
		heading := strings.TrimSpace(strings.TrimLeft(line, "#"))
		var b strings.Builder
		for _, r := range strings.ToLower(heading) {
			switch {
			case r == ' ':
				b.WriteRune('-')
			case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
				b.WriteRune(r)
			}
		}
		slug := b.String()
		if n := seen[slug]; n > 0 {
			out[slug+"-"+strconv.Itoa(n)] = true
		} else {
			out[slug] = true
		}
		seen[slug]++
	}
	return out
}

func TestEveryRelativeLinkInTheDocumentsLeadsToAFileAndHeadingThatExist(t *testing.T) {
	checked := 0
	for _, doc := range documents(t) {
		text := read(t, doc)
		targets, lines := links(text)
		for i, target := range targets {
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			file, anchor, _ := strings.Cut(target, "#")
			path := doc // a bare #anchor is in the same file
			if file != "" {
				path = filepath.ToSlash(filepath.Join(filepath.Dir(doc), file))
			}
			checked++
			info, err := os.Stat(filepath.Join(repoRoot, path))
			if err != nil {
				t.Errorf("%s:%d: link %q: %s does not exist", doc, lines[i], target, path)
				continue
			}
			if anchor == "" {
				continue
			}
			if info.IsDir() || !strings.HasSuffix(path, ".md") {
				t.Errorf("%s:%d: link %q: an anchor into %s, which is not a Markdown file", doc, lines[i], target, path)
				continue
			}
			if !anchors(read(t, path))[anchor] {
				t.Errorf("%s:%d: link %q: %s has no heading whose anchor is #%s", doc, lines[i], target, path, anchor)
			}
		}
	}
	if checked == 0 {
		t.Fatal("no relative link found: the link pattern no longer matches")
	}
}
