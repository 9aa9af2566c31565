package source

import (
	"fmt"
	"maps"
	"slices"

	"github.com/kpproxy/kp/proxy"
)

// resolve decides what each file contributes: its new content when it
// decoded and defines no object another file defines, else what it
// contributed before. An object defined in two files stays with the file
// that already had it in force (the first by name on a fresh start); the
// other file is rejected as a whole, like any broken file. It returns the
// number of new errors reported.
func (s *DirSource) resolve() int {
	names := slices.Sorted(maps.Keys(s.files))
	useNew := make(map[string]bool, len(names))
	owner := make(map[objectKey]string)
	for _, name := range names {
		f := s.files[name]
		useNew[name] = len(f.parseErrs) == 0
		for key := range f.inForce {
			owner[key] = name
		}
	}
	conflicts := make(map[string][]error)
	// Rejecting a file puts its old content back, which can collide with
	// another file's new content: repeat until nothing collides. Each
	// round rejects one more file, so this ends.
	for changed := true; changed; {
		changed = false
		claims := make(map[objectKey][]string)
		for _, name := range names {
			for _, o := range s.candidate(name, useNew[name]) {
				claims[o.key] = append(claims[o.key], name)
			}
		}
		for _, key := range slices.SortedFunc(maps.Keys(claims), compareKeys) {
			claimants := claims[key]
			if len(claimants) < 2 {
				continue
			}
			winner := claimants[0]
			if o, ok := owner[key]; ok && slices.Contains(claimants, o) {
				winner = o
			}
			for _, name := range claimants {
				// A file whose content is already its old one owns
				// what it defines, so only new content loses.
				if name == winner || !useNew[name] {
					continue
				}
				useNew[name] = false
				f := s.files[name]
				doc := 0
				if i := slices.IndexFunc(f.objs, func(o manifestObject) bool { return o.key == key }); i >= 0 {
					doc = f.objs[i].document
				}
				conflicts[name] = append(conflicts[name], &ManifestError{File: f.path, Document: doc,
					Err: fmt.Errorf("%s is already defined in %s", key, s.files[winner].path)})
				changed = true
			}
			if changed {
				break
			}
		}
	}

	reported := 0
	for _, name := range names {
		f := s.files[name]
		if useNew[name] {
			f.inForce = make(map[objectKey]manifestObject, len(f.objs))
			for _, o := range f.objs {
				f.inForce[o.key] = o
			}
		}
		if proxy.ErrorsKey(conflicts[name]) != proxy.ErrorsKey(f.conflicts) {
			msg := "manifest rejected; the file contributes nothing until it is fixed"
			if len(f.inForce) > 0 {
				msg = "manifest rejected; its previous content stays in force"
			}
			for _, err := range conflicts[name] {
				s.log.Error(msg, "file", f.path, "error", err.Error())
				reported++
			}
		}
		f.conflicts = conflicts[name]
	}
	return reported
}

func (s *DirSource) candidate(name string, useNew bool) []manifestObject {
	f := s.files[name]
	if useNew {
		return f.objs
	}
	return slices.Collect(maps.Values(f.inForce))
}
