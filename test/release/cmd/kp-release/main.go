// Command kp-release writes kp's release into a directory: `make release
// VERSION=v0.1.0` runs it (see docs/release.md and package release).
//
//	kp-release -version v0.1.0 -o dist
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"

	"github.com/kpproxy/kp/test/netns"
	"github.com/kpproxy/kp/test/release"
)

func main() {
	var o release.Options
	flag.StringVar(&o.Version, "version", "", "the release's version, vMAJOR.MINOR.PATCH (required)")
	flag.StringVar(&o.Out, "o", "dist", "the directory to write (replaced if it holds an earlier release)")
	flag.StringVar(&o.ImageRepo, "image-repo", release.DefaultImageRepo, "the image's repository; the manifests pin repo@digest")
	flag.StringVar(&o.Commit, "commit", "", "the commit released (default: HEAD)")
	flag.StringVar(&o.Date, "date", "", "the commit's date, RFC 3339 (default: HEAD's commit date)")
	flag.BoolVar(&o.AllowDirty, "allow-dirty", false, "release a checkout with uncommitted changes (not for a real release)")
	flag.Usage = func() {
		fmt.Fprintf(flag.CommandLine.Output(), `Usage: kp-release -version vX.Y.Z [flags]

Writes kp's release: static kp binaries for linux/amd64 and linux/arm64, the
image for both (an OCI image index tarball, from Debian 12 packages fetched with
apt-get download), an SBOM of each (CycloneDX), the manifests rendered with the
image pinned by digest, and SHA256SUMS. The same commit gives the same files.

Example:
  kp-release -version v0.1.0 -o dist
  cd dist && sha256sum -c SHA256SUMS

Flags:
`)
		flag.PrintDefaults()
	}
	flag.Parse()
	if flag.NArg() > 0 {
		flag.Usage()
		os.Exit(2)
	}
	root, err := netns.ModuleRoot()
	if err != nil {
		fmt.Fprintln(os.Stderr, "kp-release:", err)
		os.Exit(1)
	}
	o.Root, o.Log = root, os.Stderr
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	r, err := release.Build(ctx, o)
	if err != nil {
		fmt.Fprintln(os.Stderr, "kp-release:", err)
		os.Exit(1)
	}
	fmt.Printf("release: %s (commit %s, %s)\n", r.Version, r.Commit, r.Date)
	fmt.Printf("dir:     %s\n", r.Out)
	fmt.Printf("image:   %s:%s\n", r.ImageRepo, r.Version)
	fmt.Printf("pinned:  %s\n", r.Image)
	for _, f := range r.Files {
		fmt.Printf("  %s\n", f)
	}
}
