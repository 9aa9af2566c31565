package image

import (
	"fmt"
	"slices"
	"strings"
)

// DebianLayer is a layer of Debian 12 packages, assembled the way KP's
// userland is: every file of the whole packages but documentation, the
// shared libraries and dynamic loader their ELF files need (found, through
// DT_NEEDED, in any of the packages, libs being there only to provide
// them), and each package's copyright. No package manager runs, so nothing
// a maintainer script would make (alternatives, /bin/sh) is there: the
// caller adds such links in a layer of its own. A failure to download the
// packages wraps ErrDownload; a library no listed package holds is an
// error naming the file that needs it.
func DebianLayer(whole, libs []string, opts ...KPOption) ([]Entry, error) {
	var o kpOptions
	for _, opt := range opts {
		opt(&o)
	}
	if o.cache == "" {
		var err error
		if o.cache, err = debCacheDir(); err != nil {
			return nil, fmt.Errorf("debian layer: %w", err)
		}
	}
	tree, err := fetchDebs(o.cache, o.arch, append(slices.Clone(whole), libs...))
	if err != nil {
		return nil, fmt.Errorf("debian layer: %w", err)
	}
	take := map[string]bool{}
	roots := map[string]string{}
	for p, f := range tree.files {
		if !slices.Contains(whole, f.pkg) || slices.ContainsFunc(leftOut, func(dir string) bool { return strings.HasPrefix(p, dir) }) {
			continue
		}
		if f.mode.IsRegular() {
			roots[p] = f.host
		}
		take[p] = true
	}
	closure, err := libraryClosure(tree, roots)
	if err != nil {
		return nil, fmt.Errorf("debian layer: %w", err)
	}
	for _, p := range closure {
		take[p] = true
	}
	// Links into what stayed out (documentation) would dangle.
	for changed := true; changed; {
		changed = false
		for p := range take {
			if !resolvesIn(tree, take, p) {
				delete(take, p)
				changed = true
			}
		}
	}
	var entries []Entry
	pkgs := map[string]bool{}
	for p := range take {
		entries = append(entries, tree.files[p].entry(p))
		pkgs[tree.files[p].pkg] = true
	}
	// The licences of what the image redistributes stay.
	for pkg := range pkgs {
		p := "/usr/share/doc/" + pkg + "/copyright"
		if f, ok := tree.files[p]; ok && f.mode.IsRegular() {
			entries = append(entries, f.entry(p))
		}
	}
	return entries, nil
}
