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
		RunE: func(cmd *cobra.Command, _ []string) error {
			_, err := fmt.Fprintf(a.stdout, "kp version %s\ngit commit: %s\ngo version: %s %s/%s\n",
				a.version, a.commit, runtime.Version(), runtime.GOOS, runtime.GOARCH)
			return err
		},
	}
}
