package options

import (
	"flag"
	"fmt"
	"io"
	"log/slog"
	"strconv"

	"github.com/spf13/pflag"
	"k8s.io/klog/v2"
)

// LogOptions are the logging flags every command shares. The KubeProxyConfiguration
// file's logging section can set them too (flags win).
type LogOptions struct {
	format    string // text or json
	verbosity int    // klog-style -v
}

// DefaultLogOptions are text at verbosity 0.
func DefaultLogOptions() LogOptions { return LogOptions{format: "text"} }

// AddFlags binds the logging flags to o.
func (o *LogOptions) AddFlags(fs *pflag.FlagSet) {
	fs.StringVar(&o.format, "log-format", o.format, "Log format: text or json.")
	// Upstream's name for the same thing, so a kube-proxy DaemonSet's
	// --logging-format=json keeps working.
	fs.StringVar(&o.format, "logging-format", o.format, "Same as --log-format (kube-proxy's name for it).")
	_ = fs.MarkHidden("logging-format")
	fs.IntVarP(&o.verbosity, "v", "v", o.verbosity,
		"Log verbosity, as klog's -v: 0 logs what an operator needs, higher numbers add detail "+
			"(client-go's klog messages at their own level, kp's debug messages from 4).")
}

// logLevel maps klog verbosity onto slog: klog's V(n) arrives through logr as
// slog.Level(-n), so -v n must let levels down to -n through. kp's own Debug
// (-4) therefore shows from -v 4.
func (o LogOptions) logLevel() slog.Level {
	if o.verbosity <= 0 {
		return slog.LevelInfo
	}
	return slog.Level(-o.verbosity)
}

func (o LogOptions) validate() error {
	switch o.format {
	case "text", "json":
	default:
		return fmt.Errorf("--log-format %q: must be text or json", o.format)
	}
	if o.verbosity < 0 {
		return fmt.Errorf("--v %d: must be 0 or more", o.verbosity)
	}
	return nil
}

// NewLogger builds kp's logger writing to w and routes klog (client-go's
// logging) into it, so one process writes one log format.
func NewLogger(w io.Writer, o LogOptions) (*slog.Logger, error) {
	if err := o.validate(); err != nil {
		return nil, err
	}
	hopts := &slog.HandlerOptions{Level: o.logLevel()}
	var h slog.Handler
	if o.format == "json" {
		h = slog.NewJSONHandler(w, hopts)
	} else {
		h = slog.NewTextHandler(w, hopts)
	}
	log := slog.New(h)
	routeKlog(log, o.verbosity)
	return log, nil
}

// routeKlog sends klog's output to log. klog is process-global state (client-go
// logs through it), so this is the one place kp touches it. klog checks its
// own -v before calling the logger for klog.V(n) calls, so it gets the same
// verbosity.
func routeKlog(log *slog.Logger, verbosity int) {
	klog.SetSlogLogger(log)
	fs := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(fs)
	_ = fs.Set("v", strconv.Itoa(verbosity))
}
