package image

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"sync"
)

// ErrDownload marks a failure to fetch the Debian packages an image is made
// of: no apt-get, no apt lists (run apt-get update) or no network. Tests skip
// on it outside CI.
var ErrDownload = errors.New("cannot download Debian packages")

// debTree is a set of Debian packages unpacked side by side, one directory
// each, so that what came from which package stays known.
type debTree struct {
	// arch is the packages' Debian architecture (amd64, arm64).
	arch string
	// dir holds one directory per package, named after it.
	dir string
	// debs maps each package to the .deb it was unpacked from.
	debs map[string]string
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

// DebPackage is one Debian package an image was assembled from, as apt-get
// downloaded it.
type DebPackage struct {
	Name    string // iptables
	Version string // 1.8.9-2, with its epoch if it has one (1:2.5.1-4)
	Arch    string // amd64, arm64 or all
	// SHA256 is the .deb's (hex), as Debian's Packages index lists it.
	SHA256 string
}

// packages describes the packages of t, in the order of names.
func (t *debTree) packages(names []string) ([]DebPackage, error) {
	var out []DebPackage
	for _, name := range names {
		deb, ok := t.debs[name]
		if !ok {
			return nil, fmt.Errorf("debian package %s: no .deb beside %s", name, t.dir)
		}
		// apt-get download names files <name>_<version>_<arch>.deb, the
		// version escaped (%3a for the epoch's colon).
		fields := strings.Split(strings.TrimSuffix(filepath.Base(deb), ".deb"), "_")
		if len(fields) != 3 || fields[0] != name {
			return nil, fmt.Errorf("debian package %s: %s is not named <name>_<version>_<arch>.deb", name, deb)
		}
		version, err := url.PathUnescape(fields[1])
		if err != nil {
			return nil, fmt.Errorf("debian package %s: version in %s: %w", name, deb, err)
		}
		b, err := os.ReadFile(deb)
		if err != nil {
			return nil, fmt.Errorf("debian package %s: %w", name, err)
		}
		sum := sha256.Sum256(b)
		out = append(out, DebPackage{Name: name, Version: version, Arch: fields[2], SHA256: hex.EncodeToString(sum[:])})
	}
	return out, nil
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

// fetchDebs downloads the packages of the Debian architecture arch (""
// or the host's: this machine's apt lists; another, such as arm64 on an
// amd64 host: apt lists of that architecture kept in cache/apt-<arch>, see
// foreignApt) and unpacks each (dpkg-deb -x) into cache/debs-<hash of the
// names>, or cache/debs-<arch>-<hash> for a foreign architecture, or reuses
// that directory when an earlier run filled it. apt-get download takes the
// candidate version of each. The directory appears whole or not at all, so
// concurrent runs and interrupted ones never see half of it. Remove it to
// fetch newer versions.
func fetchDebs(cache, arch string, pkgs []string) (*debTree, error) {
	host, err := hostArch()
	if err != nil {
		return nil, err
	}
	if arch == "" {
		arch = host
	}
	names := slices.Clone(pkgs)
	slices.Sort(names)
	sum := sha256.Sum256([]byte(strings.Join(names, "\n")))
	key := "debs-" + hex.EncodeToString(sum[:])[:16]
	var aptArgs []string
	if arch != host {
		key = "debs-" + arch + "-" + hex.EncodeToString(sum[:])[:16]
	}
	dir := filepath.Join(cache, key)
	if _, err := os.Stat(filepath.Join(dir, "x")); err != nil {
		if err := os.MkdirAll(cache, 0o755); err != nil {
			return nil, fmt.Errorf("debian packages: %w", err)
		}
		if arch != host {
			if aptArgs, err = foreignApt(cache, arch); err != nil {
				return nil, err
			}
		}
		tmp, err := os.MkdirTemp(cache, "tmp-debs-")
		if err != nil {
			return nil, fmt.Errorf("debian packages: %w", err)
		}
		defer os.RemoveAll(tmp)
		if err := downloadDebs(tmp, aptArgs, names); err != nil {
			return nil, err
		}
		if err := os.Rename(tmp, dir); err != nil {
			// Another run got there first: use its copy.
			if _, serr := os.Stat(filepath.Join(dir, "x")); serr != nil {
				return nil, fmt.Errorf("debian packages: %w", err)
			}
		}
	}
	t, err := readDebTree(filepath.Join(dir, "x"), names)
	if err != nil {
		return nil, err
	}
	t.arch = arch
	return t, nil
}

var hostArchOnce = sync.OnceValues(func() (string, error) {
	out, err := exec.Command("dpkg", "--print-architecture").Output()
	if err != nil {
		return "", fmt.Errorf("%w: dpkg --print-architecture: %v (a Debian machine is needed)", ErrDownload, err)
	}
	return strings.TrimSpace(string(out)), nil
})

// hostArch is this machine's Debian architecture.
func hostArch() (string, error) { return hostArchOnce() }

// foreignApt returns apt-get's options for packages of another
// architecture than the host's, from package lists of that architecture
// alone that it fetches (apt-get update, once; remove the directory to
// refresh them) into cache/apt-<arch>, from the host's sources. The host's
// apt state is neither read nor changed: no dpkg --add-architecture, no
// status file, lists and archives of their own.
func foreignApt(cache, arch string) ([]string, error) {
	dir := filepath.Join(cache, "apt-"+arch)
	args := []string{
		"-o", "APT::Architecture=" + arch, "-o", "APT::Architectures::=" + arch,
		"-o", "Dir::State::Lists=" + filepath.Join(dir, "lists"),
		"-o", "Dir::Cache=" + filepath.Join(dir, "cache"),
		"-o", "Dir::State::status=/dev/null",
		// The lists are this cache's, not the _apt user's to write.
		"-o", "APT::Sandbox::User=root",
		// Only the Packages indices: no translations, no DEP-11.
		"-o", "Acquire::Languages=none", "-o", "Acquire::IndexTargets::deb::DEP-11::DefaultEnabled=false",
		"-o", "Acquire::IndexTargets::deb::DEP-11-icons::DefaultEnabled=false",
		"-o", "Acquire::IndexTargets::deb::DEP-11-icons-small::DefaultEnabled=false",
	}
	lists, _ := filepath.Glob(filepath.Join(dir, "lists", "*_binary-"+arch+"_Packages*"))
	if len(lists) > 0 {
		return args, nil
	}
	for _, d := range []string{"lists/partial", "cache/archives/partial"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			return nil, fmt.Errorf("apt lists for %s: %w", arch, err)
		}
	}
	if _, err := exec.LookPath("apt-get"); err != nil {
		return nil, fmt.Errorf("%w: no apt-get on the PATH (a Debian machine is needed)", ErrDownload)
	}
	cmd := exec.Command("apt-get", append(append([]string{"-q"}, args...), "update")...)
	if out, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("%w: apt-get update of the %s lists in %s: %v\n%s", ErrDownload, arch, dir, err, out)
	}
	return args, nil
}

// downloadDebs fetches names into dir, with apt-get's options aptArgs,
// and unpacks each into dir/x/<name>.
func downloadDebs(dir string, aptArgs, names []string) error {
	if _, err := exec.LookPath("apt-get"); err != nil {
		return fmt.Errorf("%w: no apt-get on the PATH (a Debian machine is needed)", ErrDownload)
	}
	cmd := exec.Command("apt-get", append(append(append([]string{"-q"}, aptArgs...), "download"), names...)...)
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
	t := &debTree{dir: dir, files: map[string]debFile{}, debs: map[string]string{}}
	// The .deb files are beside x/.
	debs, err := filepath.Glob(filepath.Join(filepath.Dir(dir), "*.deb"))
	if err != nil {
		return nil, err
	}
	for _, name := range names {
		// apt-get download names files <name>_<version>_<arch>.deb.
		if i := slices.IndexFunc(debs, func(p string) bool { return strings.HasPrefix(filepath.Base(p), name+"_") }); i >= 0 {
			t.debs[name] = debs[i]
		}
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
