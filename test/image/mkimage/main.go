// Command mkimage writes one container image, whose layers are host
// directories, as a Docker-format tarball (see package image). The scripts
// that build test images (test/k8s/images.sh) stage each layer's files in a
// directory and call it:
//
//	go run ./test/image/mkimage -ref kp.local/coredns:v1.15.0 \
//	    -entrypoint /coredns -cmd -conf -cmd /etc/coredns/Corefile \
//	    -o coredns.tar rootfs/
//
// With -deb (and -deblib), the first layer is Debian 12 packages (see
// image.DebianLayer), the directories' layers come after it:
//
//	go run ./test/image/mkimage -ref kp.local/dig:1 -deb bind9-dnsutils \
//	    -deblib libc6 -deblib bind9-libs ... -o dig.tar extra/
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/kpproxy/kp/test/image"
)

// list is a repeatable string flag: each use appends one element.
type list []string

func (l *list) String() string     { return fmt.Sprint(*l) }
func (l *list) Set(v string) error { *l = append(*l, v); return nil }

func main() {
	var (
		img             image.Image
		out             string
		entrypoint, cmd list
		env             list
		debs, debLibs   list
	)
	flag.StringVar(&img.Ref, "ref", "", "the image's reference, e.g. kp.local/pause:v1 (a dotted registry name: containerd prefixes bare names with docker.io)")
	flag.StringVar(&out, "o", "", "the tarball to write")
	flag.Var(&entrypoint, "entrypoint", "one element of the entrypoint (repeat for more)")
	flag.Var(&cmd, "cmd", "one element of the default arguments (repeat for more)")
	flag.Var(&env, "env", "one NAME=value of the environment (repeat for more)")
	flag.Var(&debs, "deb", "a Debian package the first layer holds whole (repeat for more)")
	flag.Var(&debLibs, "deblib", "a Debian package the first layer takes only the libraries -deb's programs need from (repeat for more)")
	flag.StringVar(&img.WorkingDir, "workdir", "", "the working directory")
	flag.Usage = func() {
		fmt.Fprintf(flag.CommandLine.Output(), "usage: mkimage -ref REF -o FILE.tar [flags] LAYER_DIR...\n\n"+
			"Each LAYER_DIR becomes one layer, its root the image's /, after the\n"+
			"Debian packages' layer if -deb is given.\n\n")
		flag.PrintDefaults()
	}
	flag.Parse()
	if img.Ref == "" || out == "" || flag.NArg()+len(debs) == 0 {
		flag.Usage()
		os.Exit(2)
	}
	img.Entrypoint, img.Cmd, img.Env = entrypoint, cmd, env
	if len(debs) > 0 {
		layer, err := image.DebianLayer(debs, debLibs)
		if err != nil {
			fmt.Fprintln(os.Stderr, "mkimage:", err)
			os.Exit(1)
		}
		img.Layers = append(img.Layers, layer)
	}
	for _, dir := range flag.Args() {
		layer, err := image.Tree(dir)
		if err != nil {
			fmt.Fprintln(os.Stderr, "mkimage:", err)
			os.Exit(1)
		}
		img.Layers = append(img.Layers, layer)
	}
	written, err := image.Write(out, img)
	if err != nil {
		fmt.Fprintln(os.Stderr, "mkimage:", err)
		os.Exit(1)
	}
	fmt.Printf("%s %s %s\n", out, written[0].Ref, written[0].Digest)
}
