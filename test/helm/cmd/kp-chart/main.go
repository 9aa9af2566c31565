// Command kp-chart is helm template, lint and package for charts/kp,
// through Helm's Go module, for machines without the helm CLI: the
// real-node test renders the chart with it and applies what it prints;
// a release packages the chart with it.
//
//	kp-chart template kp ./charts/kp --namespace kube-system --set apiServer=https://10.0.0.10:6443 --set clusterCIDR=10.244.0.0/16
//	kp-chart lint ./charts/kp
//	kp-chart package ./charts/kp -d dist --version 0.1.0 --app-version v0.1.0 \
//	  --image-repository ghcr.io/kpproxy/kp --image-digest sha256:... --mod-time 1970-01-01T00:00:00Z
//
// As with helm, template's and lint's values come from --set, --set-string
// and --set-file (repeated), the chart and files from the working
// directory: from test/helm, go run ./cmd/kp-chart ... ../../charts/kp.
package main

import (
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/kpproxy/kp/test/helm"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "kp-chart:", err)
		os.Exit(1)
	}
}

// list is a repeatable string flag.
type list []string

func (l *list) String() string     { return strings.Join(*l, ",") }
func (l *list) Set(v string) error { *l = append(*l, v); return nil }

func run(args []string) error {
	if len(args) == 0 {
		return fmt.Errorf("usage: kp-chart template NAME CHART | lint CHART | package CHART [flags]")
	}
	cmd := args[0]
	fs := flag.NewFlagSet("kp-chart "+cmd, flag.ContinueOnError)
	var v helm.Values
	fs.Var((*list)(&v.Set), "set", "a value, key=value (helm --set)")
	fs.Var((*list)(&v.SetString), "set-string", "a string value, key=value (helm --set-string)")
	fs.Var((*list)(&v.SetFile), "set-file", "a value read from a file, key=path (helm --set-file)")
	namespace := fs.String("namespace", "default", "the namespace to render for (helm --namespace)")
	dest := fs.String("d", ".", "package: where to write the archive")
	version := fs.String("version", "", "package: the chart's version (Chart.yaml's when empty)")
	appVersion := fs.String("app-version", "", "package: the chart's appVersion, the image's default tag (Chart.yaml's when empty)")
	imageRepo := fs.String("image-repository", "", "package: the image's repository in values.yaml (the chart's when empty)")
	imageDigest := fs.String("image-digest", "", "package: the image's digest in values.yaml, sha256:... (none when empty)")
	modTime := fs.String("mod-time", "", "package: every file's time in the archive, RFC 3339, for the same bytes from the same chart (the files' when empty)")
	// helm takes flags after the positional arguments: parse them apart.
	var pos []string
	rest := args[1:]
	for len(rest) > 0 {
		if err := fs.Parse(rest); err != nil {
			return err
		}
		rest = fs.Args()
		if len(rest) > 0 {
			pos, rest = append(pos, rest[0]), rest[1:]
		}
	}
	vals, err := v.Map()
	if err != nil {
		return err
	}
	switch {
	case cmd == "template" && len(pos) == 2:
		if pos[0] != helm.ReleaseName {
			return fmt.Errorf("template: release name %q: kp's objects are named kp; the README installs release kp", pos[0])
		}
		out, err := helm.Render(pos[1], *namespace, vals)
		if err != nil {
			return err
		}
		fmt.Print(out)
		return nil
	case cmd == "lint" && len(pos) == 1:
		return helm.Lint(pos[0], vals)
	case cmd == "package" && len(pos) == 1:
		o := helm.PackageOptions{Version: *version, AppVersion: *appVersion, ImageRepository: *imageRepo, ImageDigest: *imageDigest}
		if *modTime != "" {
			if o.ModTime, err = time.Parse(time.RFC3339, *modTime); err != nil {
				return fmt.Errorf("package: --mod-time: %w", err)
			}
		}
		path, err := helm.Package(pos[0], *dest, o)
		if err != nil {
			return err
		}
		fmt.Println(path)
		return nil
	}
	return fmt.Errorf("usage: kp-chart template NAME CHART | lint CHART | package CHART [flags]; got %q", args)
}
