package image

import (
	"bytes"
	"fmt"
	"io/fs"
	"os"
	"path"
	"slices"
	"strings"
)

// debPackage is one Debian package kp's image is assembled from.
type debPackage struct {
	Name string
	// Install: the Dockerfile names it in apt-get install; the others come
	// there as its dependencies.
	Install bool
	// Whole: the image takes every file of it but documentation and
	// scripts; otherwise only the shared libraries other files need.
	Whole bool
}

// kpPackages are the Debian 12 packages of kp's image, the one list both
// `make image` and the Dockerfile (its apt-get install, checked by a test)
// follow. apt-get download does not resolve dependencies: every package a
// library comes from is listed, and KP fails naming a library it cannot find.
var kpPackages = []debPackage{
	// iptables-restore and -save of both backends (xtables-nft-multi and
	// xtables-legacy-multi) for the legacy iptables mode and the iptables
	// parts of the ipvs and userspace modes; whole, because the match and
	// target extensions (xtables/*.so) are loaded with dlopen, which no
	// DT_NEEDED entry shows.
	{Name: "iptables", Install: true, Whole: true},
	// ipset, for the ipvs mode's address sets.
	{Name: "ipset", Install: true, Whole: true},
	// /etc/protocols, /etc/services, /etc/ethertypes: iptables resolves
	// protocol and service names through them. A dependency of iptables.
	{Name: "netbase", Whole: true},
	// The C library and the dynamic loader, /lib64/ld-linux-x86-64.so.2.
	{Name: "libc6"},
	// Libraries iptables links: its extension API, the legacy backend's
	// table access (IPv4, IPv6), the nft backend's netlink messages and
	// socket helpers, and conntrack (for the connlabel match).
	{Name: "libxtables12"},
	{Name: "libip4tc2"},
	{Name: "libip6tc2"},
	{Name: "libnftnl11"},
	{Name: "libmnl0"},
	{Name: "libnetfilter-conntrack3"},
	{Name: "libnfnetlink0"},
	// ipset's library.
	{Name: "libipset13"},
}

// leftOut are the directories of whole packages the image does without:
// documentation, manuals and shell completions are for people at a shell,
// and the image has none.
var leftOut = []string{
	"/usr/share/doc/", "/usr/share/man/", "/usr/share/info/",
	"/usr/share/lintian/", "/usr/share/bash-completion/",
}

// alternatives are the links update-alternatives makes when Debian installs
// iptables (its postinst), at their highest priority: the nft backend is the
// default, as on a Debian node. kp picks a backend itself and calls
// iptables-nft-* or iptables-legacy-* by name; these links serve a person
// running `iptables` in the container. They point straight at the tool (no
// /etc/alternatives): the root filesystem is read-only, so nothing switches
// them at run time.
var alternatives = map[string]string{}

func init() {
	for _, tool := range []string{"iptables", "ip6tables", "arptables", "ebtables"} {
		for _, suffix := range []string{"", "-restore", "-save"} {
			alternatives["/usr/sbin/"+tool+suffix] = tool + "-nft" + suffix
		}
	}
}

const (
	// kpPath is where the binary goes, as the Dockerfile's COPY puts it and
	// manifests/daemonset.yaml runs it.
	kpPath = "/usr/local/bin/kp"
	// kpTopPath is a link kp answers to as `kp top`.
	kpTopPath = "/usr/local/bin/kp-top"
	// debianPath is debian:12-slim's PATH, which the Dockerfile's image
	// inherits: kp finds iptables-restore, ipset and the rest through it.
	debianPath = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
)

// KPPackages names the Debian packages kp's image is assembled from.
func KPPackages() []string {
	names := make([]string, len(kpPackages))
	for i, p := range kpPackages {
		names[i] = p.Name
	}
	return names
}

// KPOption changes how KP assembles the image.
type KPOption func(*kpOptions)

type kpOptions struct {
	cache string
	arch  string
}

// WithCache keeps the downloaded Debian packages in dir instead of
// $KP_IMAGE_CACHE or ~/.cache/kp-image.
func WithCache(dir string) KPOption { return func(o *kpOptions) { o.cache = dir } }

// WithArch builds the image for the architecture arch (amd64 or arm64,
// Go's and Debian's name alike) from that architecture's Debian packages,
// instead of the host's. The kp binary must be built for it.
func WithArch(arch string) KPOption { return func(o *kpOptions) { o.arch = arch } }

// KP is kp's container image, the same the Dockerfile builds, from the kp
// binary at binary (build it static: CGO_ENABLED=0, as `make build` does):
//
//	layer 0: the Debian 12 userland of iptables (both backends) and ipset,
//	         with the shared libraries and dynamic loader they need, taken
//	         from the packages (apt-get download, dpkg-deb -x; no package
//	         manager and no shell in the image); empty /run and /tmp
//	layer 1: /usr/local/bin/kp and the kp-top link to it
//
// with ENTRYPOINT ["/usr/local/bin/kp"] and CMD ["proxy", "--help"]. For a
// static kp, the userland layer changes only when the Debian packages do. A
// failure to download them wraps ErrDownload.
//
//	img, err := image.KP("bin/kp", "kp.local/kp:dev")
//	...
//	written, err := image.Write("bin/kp-image.tar", img)
func KP(binary, ref string, opts ...KPOption) (Image, error) {
	var o kpOptions
	for _, opt := range opts {
		opt(&o)
	}
	if st, err := os.Stat(binary); err != nil {
		return Image{}, fmt.Errorf("kp image: %w", err)
	} else if !st.Mode().IsRegular() || st.Mode()&0o111 == 0 {
		return Image{}, fmt.Errorf("kp image: %s is not an executable file", binary)
	}
	if o.cache == "" {
		var err error
		if o.cache, err = debCacheDir(); err != nil {
			return Image{}, fmt.Errorf("kp image: %w", err)
		}
	}
	tree, err := fetchDebs(o.cache, o.arch, KPPackages())
	if err != nil {
		return Image{}, fmt.Errorf("kp image: %w", err)
	}
	if err := elfFor(binary, tree.arch); err != nil {
		return Image{}, fmt.Errorf("kp image: %w", err)
	}
	userland, err := kpUserland(tree, binary)
	if err != nil {
		return Image{}, fmt.Errorf("kp image: %w", err)
	}
	pkgs, err := tree.packages(KPPackages())
	if err != nil {
		return Image{}, fmt.Errorf("kp image: %w", err)
	}
	return Image{
		Ref:      ref,
		Arch:     tree.arch,
		Packages: pkgs,
		Layers: [][]Entry{userland, {
			{Path: kpPath, Source: binary, Mode: 0o755},
			Symlink(kpTopPath, "kp"),
		}},
		Entrypoint: []string{kpPath},
		Cmd:        []string{"proxy", "--help"},
		Env:        []string{debianPath},
	}, nil
}

// kpUserland selects the files of the Debian layer: the whole packages'
// files, the libraries they (and kp, if it is not static) need, the
// alternatives links, each package's copyright, and the directories
// iptables writes to.
func kpUserland(t *debTree, kpBinary string) ([]Entry, error) {
	whole := map[string]bool{}
	for _, p := range kpPackages {
		whole[p.Name] = p.Whole
	}
	take := map[string]bool{}
	roots := map[string]string{kpPath: kpBinary}
	for p, f := range t.files {
		if !whole[f.pkg] || slices.ContainsFunc(leftOut, func(dir string) bool { return strings.HasPrefix(p, dir) }) {
			continue
		}
		if f.mode.IsRegular() {
			// Scripts (iptables-apply is bash) would need an interpreter.
			if isScript(f.host) {
				continue
			}
			roots[p] = f.host
		}
		take[p] = true
	}
	libs, err := libraryClosure(t, roots)
	if err != nil {
		return nil, err
	}
	for _, p := range libs {
		take[p] = true
	}
	// Links whose target stayed out (ip6tables-apply to iptables-apply)
	// would dangle.
	for changed := true; changed; {
		changed = false
		for p := range take {
			if !resolvesIn(t, take, p) {
				delete(take, p)
				changed = true
			}
		}
	}

	var entries []Entry
	pkgs := map[string]bool{}
	for p := range take {
		entries = append(entries, t.files[p].entry(p))
		pkgs[t.files[p].pkg] = true
	}
	for link, target := range alternatives {
		if !take[path.Join(path.Dir(link), target)] {
			return nil, fmt.Errorf("alternative %s: its target %s is not in the image", link, target)
		}
		entries = append(entries, Symlink(link, target))
	}
	// Debian's copyright files are the licences of what the image
	// redistributes (GPL for iptables and ipset): they stay.
	for pkg := range pkgs {
		p := "/usr/share/doc/" + pkg + "/copyright"
		if f, ok := t.files[p]; ok && f.mode.IsRegular() {
			entries = append(entries, f.entry(p))
		}
	}
	// iptables-legacy takes the lock /run/xtables.lock (iptables-nft needs
	// none), and tools expect a /tmp. With readOnlyRootFilesystem these are
	// only mount points: the DaemonSet must mount the node's
	// /run/xtables.lock (hostPath, FileOrCreate, as kube-proxy does) before
	// kp runs a legacy mode, so that kp and the node's other iptables users
	// take the same lock.
	entries = append(entries, Dir("/run"), Entry{Path: "/tmp", Mode: fs.ModeDir | fs.ModeSticky | 0o777})
	return entries, nil
}

// resolvesIn reports whether p, followed through its links, ends at a
// regular file with every step among take.
func resolvesIn(t *debTree, take map[string]bool, p string) bool {
	target, links, err := t.resolve(p)
	if err != nil || !take[target] {
		return false
	}
	for _, l := range links {
		if !take[l] {
			return false
		}
	}
	return true
}

// isScript reports whether the file at host starts with #!.
func isScript(host string) bool {
	f, err := os.Open(host)
	if err != nil {
		return false
	}
	defer f.Close()
	b := make([]byte, 2)
	n, _ := f.Read(b)
	return bytes.Equal(b[:n], []byte("#!"))
}
