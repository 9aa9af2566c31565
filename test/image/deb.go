package image

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strings"
)

// ErrDownload marks a failure to fetch the Debian packages an image is made
// of: no apt-get, no apt lists (run apt-get update) or no network. Tests skip
// on it outside CI.
var ErrDownload = errors.New("cannot download Debian packages")

// debTree is a set of Debian packages unpacked side by side, one directory
// each, so that what came from which package stays known.
type debTree struct {
	// dir holds one directory per package, named after it.
	dir string
	// files maps every path in the packages (as it would be installed) to
	// the file on disk and the package it came from. Directories are left
	// out: the layer writer adds the parents it needs.
	files map[string]debFile
}

type debFile struct {
	pkg  string
	host string
	// mode is the file's mode as unpacked (type bits and permissions).
	mode fs.FileMode
	// link is a symbolic link's target.
	link string
}

// debCacheDir is where fetched packages are kept between runs: $KP_IMAGE_CACHE,
// else the user's cache directory (~/.cache/kp-image).
func debCacheDir() (string, error) {
	if d := os.Getenv("KP_IMAGE_CACHE"); d != "" {
		return d, nil
	}
	d, err := os.UserCacheDir()
	if err != nil {
		return "", fmt.Errorf("cache directory: %w (set KP_IMAGE_CACHE)", err)
	}
	return filepath.Join(d, "kp-image"), nil
}

// fetchDebs downloads the packages (apt-get download: the candidate version of
// each, for this machine's architecture) and unpacks each (dpkg-deb -x) into
// cache/debs-<hash of the names>, or reuses that directory when an earlier
// run filled it. The directory appears whole or not at all, so concurrent
// runs and interrupted ones never see half of it. Remove it to fetch newer
// versions.
func fetchDebs(cache string, pkgs []string) (*debTree, error) {
	names := slices.Clone(pkgs)
	slices.Sort(names)
	sum := sha256.Sum256([]byte(strings.Join(names, "\n")))
	dir := filepath.Join(cache, "debs-"+hex.EncodeToString(sum[:])[:16])
	if _, err := os.Stat(filepath.Join(dir, "x")); err != nil {
		if err := os.MkdirAll(cache, 0o755); err != nil {
			return nil, fmt.Errorf("debian packages: %w", err)
		}
		tmp, err := os.MkdirTemp(cache, "tmp-debs-")
		if err != nil {
			return nil, fmt.Errorf("debian packages: %w", err)
		}
		defer os.RemoveAll(tmp)
		if err := downloadDebs(tmp, names); err != nil {
			return nil, err
		}
		if err := os.Rename(tmp, dir); err != nil {
			// Another run got there first: use its copy.
			if _, serr := os.Stat(filepath.Join(dir, "x")); serr != nil {
				return nil, fmt.Errorf("debian packages: %w", err)
			}
		}
	}
	return readDebTree(filepath.Join(dir, "x"), names)
}

// downloadDebs fetches names into dir and unpacks each into dir/x/<name>.
func downloadDebs(dir string, names []string) error {
	if _, err := exec.LookPath("apt-get"); err != nil {
		return fmt.Errorf("%w: no apt-get on the PATH (a Debian machine is needed)", ErrDownload)
	}
	cmd := exec.Command("apt-get", append([]string{"download", "-q"}, names...)...)
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("%w: apt-get download %s: %v (run apt-get update first?)\n%s",
			ErrDownload, strings.Join(names, " "), err, out)
	}
	debs, err := filepath.Glob(filepath.Join(dir, "*.deb"))
	if err != nil {
		return err
	}
	if err := os.Mkdir(filepath.Join(dir, "x"), 0o755); err != nil {
		return err
	}
	for _, name := range names {
		// apt-get download names files <name>_<version>_<arch>.deb.
		i := slices.IndexFunc(debs, func(p string) bool { return strings.HasPrefix(filepath.Base(p), name+"_") })
		if i < 0 {
			return fmt.Errorf("%w: apt-get download left no .deb for %s", ErrDownload, name)
		}
		out := filepath.Join(dir, "x", name)
		if msg, err := exec.Command("dpkg-deb", "-x", debs[i], out).CombinedOutput(); err != nil {
			return fmt.Errorf("dpkg-deb -x %s: %v\n%s", filepath.Base(debs[i]), err, msg)
		}
	}
	return nil
}

// readDebTree lists the unpacked packages. Two packages holding the same
// path is an error: the image could hold only one of them.
func readDebTree(dir string, names []string) (*debTree, error) {
	t := &debTree{dir: dir, files: map[string]debFile{}}
	for _, name := range names {
		root := filepath.Join(dir, name)
		err := filepath.WalkDir(root, func(host string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() {
				return err
			}
			rel, err := filepath.Rel(root, host)
			if err != nil {
				return err
			}
			p := "/" + filepath.ToSlash(rel)
			info, err := d.Info()
			if err != nil {
				return err
			}
			f := debFile{pkg: name, host: host, mode: info.Mode()}
			if f.mode&fs.ModeSymlink != 0 {
				if f.link, err = os.Readlink(host); err != nil {
					return err
				}
			}
			if prev, dup := t.files[p]; dup {
				return fmt.Errorf("%s is in both %s and %s", p, prev.pkg, name)
			}
			t.files[p] = f
			return nil
		})
		if err != nil {
			return nil, fmt.Errorf("debian package %s (unpacked in %s): %w", name, root, err)
		}
	}
	return t, nil
}

// resolve follows symbolic links from p, as the image would, to the path of
// a regular file of the tree. It returns every link on the way too.
func (t *debTree) resolve(p string) (target string, links []string, err error) {
	for range 40 {
		f, ok := t.files[p]
		if !ok {
			return "", links, fmt.Errorf("%s: not in the packages", p)
		}
		if f.mode&fs.ModeSymlink == 0 {
			return p, links, nil
		}
		links = append(links, p)
		if path.IsAbs(f.link) {
			p = path.Clean(f.link)
		} else {
			p = path.Join(path.Dir(p), f.link)
		}
	}
	return "", links, fmt.Errorf("%s: too many levels of symbolic links", p)
}

// entry is f as a layer entry at p.
func (f debFile) entry(p string) Entry {
	if f.mode&fs.ModeSymlink != 0 {
		return Symlink(p, f.link)
	}
	return Entry{Path: p, Source: f.host, Mode: f.mode & (fs.ModePerm | fs.ModeSetuid | fs.ModeSetgid | fs.ModeSticky)}
}
