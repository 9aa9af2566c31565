// Command kp-image writes kp's container image as a Docker-format tarball,
// without Docker or a registry: `make image` runs it. Load the result with
// `ctr -n k8s.io images import`, `docker load` or `kind load image-archive`.
//
//	kp-image -kp bin/kp -ref kp.local/kp:v0.1.0 -o bin/kp-image.tar
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/kpproxy/kp/test/image"
)

func main() {
	kp := flag.String("kp", "bin/kp", "the kp binary to put in the image (static: make build)")
	ref := flag.String("ref", "kp.local/kp:dev", "the image's name; a dotted registry part keeps containerd from reading it as docker.io/...")
	out := flag.String("o", "bin/kp-image.tar", "the tarball to write")
	flag.Usage = func() {
		fmt.Fprintf(flag.CommandLine.Output(), `Usage: kp-image [flags]

Writes kp's image (kp, the kp-top link, iptables and ipset from Debian 12
packages fetched with apt-get download) as a Docker-format tarball.

Example:
  kp-image -kp bin/kp -ref kp.local/kp:v0.1.0 -o bin/kp-image.tar
  ctr -n k8s.io images import bin/kp-image.tar

Flags:
`)
		flag.PrintDefaults()
	}
	flag.Parse()
	if err := run(*kp, *ref, *out); err != nil {
		fmt.Fprintln(os.Stderr, "kp-image:", err)
		os.Exit(1)
	}
}

func run(kp, ref, out string) error {
	img, err := image.KP(kp, ref)
	if err != nil {
		return err
	}
	written, err := image.Write(out, img)
	if err != nil {
		return err
	}
	st, err := os.Stat(out)
	if err != nil {
		return err
	}
	w := written[0]
	fmt.Printf("image:  %s\n", w.Ref)
	fmt.Printf("file:   %s\n", out)
	fmt.Printf("digest: %s\n", w.Digest)
	fmt.Printf("id:     %s\n", w.ID)
	fmt.Printf("size:   %d bytes (%.1f MiB)\n", st.Size(), float64(st.Size())/(1<<20))
	return nil
}
