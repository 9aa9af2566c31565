package main

import (
	"fmt"
	"runtime"
	"runtime/debug"
	"strings"

	"github.com/spf13/cobra"
)

func newVersionCommand(a *app) *cobra.Command {
	return &cobra.Command{
		Use:     "version",
		Short:   "Print kp's version, git commit and Go version",
		Example: `  kp version`,
		Args:    cobra.NoArgs,
		RunE:    func(cmd *cobra.Command, _ []string) error { return a.printVersion(true) },
	}
}

// printVersion prints kp's version: one line as upstream's --version
// ("kp v1.2.3"), or in full (kp version, --version=raw).
func (a *app) printVersion(full bool) error {
	if !full {
		_, err := fmt.Fprintf(a.stdout, "kp %s\n", a.version)
		return err
	}
	_, err := fmt.Fprintf(a.stdout, "kp version %s\ngit commit: %s\ngo version: %s %s/%s\n",
		a.version, a.commit, runtime.Version(), runtime.GOOS, runtime.GOARCH)
	return err
}

// moduleVersion fills in a version and commit the build did not stamp
// (-ldflags -X, as the Makefile does) from what Go recorded: the module's
// version when kp was built with `go install github.com/kpproxy/kp/cmd/kp@v…`,
// and the commit a pseudo-version names, or the checkout's when built
// from one with VCS stamping.
func moduleVersion(version, commit string, info *debug.BuildInfo) (string, string) {
	mod := info.Main.Version
	if version == "dev" && mod != "" && mod != "(devel)" {
		version = mod
	}
	if commit != "dev" {
		return version, commit
	}
	for _, s := range info.Settings {
		if s.Key == "vcs.revision" && s.Value != "" {
			return version, s.Value
		}
	}
	// A pseudo-version (v0.0.0-20261127081500-4746c90bd29f, also
	// v1.2.4-0.2026…-<rev>) ends in 12 hex digits of the commit.
	if i := strings.LastIndexByte(mod, '-'); i > 0 && len(mod)-i-1 == 12 && strings.Count(mod, "-") >= 2 {
		rev := mod[i+1:]
		if strings.Trim(rev, "0123456789abcdef") == "" {
			return version, rev
		}
	}
	return version, commit
}
