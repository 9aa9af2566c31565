package options

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/spf13/pflag"
)

// versionFlag is upstream's --version: --version (or =true) prints the
// version and exits, --version=raw prints it in full, --version=false does
// nothing; --version=vX.Y.Z, upstream's way to change the version it
// reports, is accepted and does nothing in kp.
type versionFlag string

func (v *versionFlag) addFlag(fs *pflag.FlagSet) {
	*v = "false"
	fs.Var(v, "version", "--version, --version=raw prints version information and quits; "+
		"--version=vX.Y.Z... sets the reported version (accepted, without effect, by kp)")
	fs.Lookup("version").NoOptDefVal = "true"
}

func (v *versionFlag) String() string { return string(*v) }

func (v *versionFlag) Set(s string) error {
	switch {
	case s == "raw":
	case strings.HasPrefix(s, "v"):
	default:
		b, err := strconv.ParseBool(s)
		if err != nil {
			return fmt.Errorf("want true, false, raw or vX.Y.Z: %w", err)
		}
		s = strconv.FormatBool(b)
	}
	*v = versionFlag(s)
	return nil
}

func (v *versionFlag) Type() string { return "version" }

// Requested reports whether the version is to be printed, and whether in
// full (raw).
func (v versionFlag) Requested() (print, raw bool) {
	return v == "true" || v == "raw", v == "raw"
}
