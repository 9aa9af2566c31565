package main

import (
	"fmt"
	"runtime"

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
