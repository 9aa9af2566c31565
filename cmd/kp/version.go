package main

import (
	"encoding/json"
	"fmt"
	"runtime"
	"runtime/debug"
	"strings"

	"github.com/spf13/cobra"

	"github.com/kpproxy/kp/proxy/statusapi"
)

func newVersionCommand(a *app) *cobra.Command {
	var output string
	cmd := &cobra.Command{
		Use:   "version",
		Short: "Print kp's version, git commit, build date and Go version",
		Example: `  kp version
  kp version -o json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			switch output {
			case "text":
				return a.printVersion(true)
			case "json":
				return a.printVersionJSON()
			}
			return fmt.Errorf("--output %q: want text or json", output)
		},
	}
	cmd.Flags().StringVarP(&output, "output", "o", "text", "text, or json (the status API's build object)")
	return cmd
}

// build is the kp binary that runs, as the status API and kp_build_info
// report it.
func (a *app) build() statusapi.Build {
	return statusapi.Build{Version: a.version, Commit: a.commit, BuildDate: a.date,
		GoVersion: runtime.Version(), Platform: runtime.GOOS + "/" + runtime.GOARCH}
}

func (a *app) printVersionJSON() error {
	enc := json.NewEncoder(a.stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(a.build())
}

// printVersion prints kp's version: one line as upstream's --version
// ("kp v1.2.3"), or in full (kp version, --version=raw).
func (a *app) printVersion(full bool) error {
	if !full {
		_, err := fmt.Fprintf(a.stdout, "kp %s\n", a.version)
		return err
	}
	_, err := fmt.Fprintf(a.stdout, "kp version %s\ngit commit: %s\nbuild date: %s\ngo version: %s %s/%s\n",
		a.version, a.commit, a.date, runtime.Version(), runtime.GOOS, runtime.GOARCH)
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
