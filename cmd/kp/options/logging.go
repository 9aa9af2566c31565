package options

import (
	"flag"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"time"

	"github.com/go-logr/logr"
	"github.com/spf13/pflag"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/textlogger"
)

// LogOptions are the logging flags every command shares, upstream's
// (component-base's logs API) with kp's older names kept. The
// KubeProxyConfiguration file's logging section sets them too; flags set on
// the command line win, as upstream.
type LogOptions struct {
	format    string // text (klog's header and key="value" pairs) or json (upstream's zap shape)
	verbosity int    // klog's -v
	// The process tuning upstream offers, checked as upstream checks it:
	// vmodule (upstream's per-file verbosity, text only), flush frequency
	// (kp writes each line unbuffered) and, behind LoggingAlphaOptions,
	// split streams (honoured: info to stdout, errors to stderr) and an
	// info buffer size (accepted, never buffers).
	vmodule        string
	flushFrequency time.Duration
	textSplit      bool
	jsonSplit      bool
	textBuffer     quantity
	jsonBuffer     quantity
}

// DefaultLogOptions are text at verbosity 0, as upstream.
func DefaultLogOptions() LogOptions {
	return LogOptions{format: "text", flushFrequency: 5 * time.Second, textBuffer: "0", jsonBuffer: "0"}
}

// AddFlags binds the logging flags to o.
func (o *LogOptions) AddFlags(fs *pflag.FlagSet) {
	fs.StringVar(&o.format, "logging-format", o.format,
		`Sets the log format. Permitted formats: "json" (gated by LoggingBetaOptions), "text". `+
			`text is klog's (I1127 04:46:08.729123   12345 file.go:123] "msg" key="value"), as kube-proxy writes it.`)
	// kp's older name for the same flag.
	fs.StringVar(&o.format, "log-format", o.format, "Same as --logging-format (kp's older name for it).")
	fs.IntVarP(&o.verbosity, "v", "v", o.verbosity,
		"number for the log level verbosity: 0 logs what an operator needs, higher numbers add detail "+
			"(client-go's klog messages at their own level, kp's debug messages from 4).")
	fs.StringVar(&o.vmodule, "vmodule", o.vmodule,
		"comma-separated list of pattern=N settings for file-filtered logging (only works for text log format). "+
			"Accepted for kube-proxy compatibility and checked; kp's logs have one verbosity.")
	fs.DurationVar(&o.flushFrequency, "log-flush-frequency", o.flushFrequency,
		"Maximum number of seconds between log flushes. Accepted for kube-proxy compatibility: kp writes each line at once.")
	fs.BoolVar(&o.textSplit, "log-text-split-stream", false,
		"[Alpha] In text format, write error messages to stderr and info messages to stdout. "+
			"The default is a single stream (kp: stderr). Enable the LoggingAlphaOptions feature gate to use this.")
	fs.Var(&o.textBuffer, "log-text-info-buffer-size",
		"[Alpha] In text format with split output streams, the info messages can be buffered for a while to increase "+
			"performance (kp accepts it and does not buffer). Enable the LoggingAlphaOptions feature gate to use this.")
	fs.BoolVar(&o.jsonSplit, "log-json-split-stream", false,
		"[Alpha] In JSON format, write error messages to stderr and info messages to stdout. "+
			"The default is a single stream (kp: stderr). Enable the LoggingAlphaOptions feature gate to use this.")
	fs.Var(&o.jsonBuffer, "log-json-info-buffer-size",
		"[Alpha] In JSON format with split output streams, the info messages can be buffered for a while to increase "+
			"performance (kp accepts it and does not buffer). Enable the LoggingAlphaOptions feature gate to use this.")
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

// validate checks o alone; validateGated checks what the feature gates
// allow (upstream's logsapi.Validate, with its messages).
func (o LogOptions) validate() error {
	switch o.format {
	case "text", "json":
	default:
		return fmt.Errorf("--logging-format %q: must be text or json", o.format)
	}
	if o.verbosity < 0 {
		return fmt.Errorf("--v %d: must be 0 or more", o.verbosity)
	}
	if _, err := parseVModule(o.vmodule); err != nil {
		return fmt.Errorf("--vmodule %q: %w", o.vmodule, err)
	}
	return nil
}

func (o LogOptions) validateGated(enabled func(gate string) bool) []settingProblem {
	var errs []settingProblem
	if o.format == "json" && !enabled("LoggingBetaOptions") {
		errs = append(errs, settingProblem{"logging.format", "logging-format", "Forbidden: Log format json is disabled, see LoggingBetaOptions feature"})
	}
	if o.flushFrequency <= 0 {
		errs = append(errs, settingProblem{"logging.flushFrequency", "log-flush-frequency",
			fmt.Sprintf("Invalid value: %q: Must be greater than zero", o.flushFrequency)})
	}
	if o.vmodule != "" && o.format != "text" {
		errs = append(errs, settingProblem{"logging.vmodule", "vmodule", "Forbidden: Only supported for text log format"})
	}
	for _, f := range []struct {
		format, field, flag string
		set                 bool
	}{
		{"text", "splitStream", "log-text-split-stream", o.textSplit},
		{"text", "infoBufferSize", "log-text-info-buffer-size", !o.textBuffer.zero()},
		{"json", "splitStream", "log-json-split-stream", o.jsonSplit},
		{"json", "infoBufferSize", "log-json-info-buffer-size", !o.jsonBuffer.zero()},
	} {
		if f.set && !enabled("LoggingAlphaOptions") {
			errs = append(errs, settingProblem{"logging.options." + f.format + "." + f.field, f.flag,
				"Forbidden: Feature LoggingAlphaOptions is disabled"})
		}
	}
	return errs
}

// NewLogger builds kp's logger writing to stderr (info to stdout too, with a
// split stream) and routes klog (client-go's logging) into it, so one
// process writes one log format.
func NewLogger(stdout, stderr io.Writer, o LogOptions) (*slog.Logger, error) {
	if err := o.validate(); err != nil {
		return nil, err
	}
	h := o.handler(stderr)
	if (o.format == "text" && o.textSplit) || (o.format == "json" && o.jsonSplit) {
		h = splitHandler{info: o.handler(stdout), errors: h}
	}
	log := slog.New(h)
	routeKlog(log, o.verbosity)
	return log, nil
}

func (o LogOptions) handler(w io.Writer) slog.Handler {
	if o.format == "json" {
		return newJSONHandler(w, o.logLevel())
	}
	// klog's own text logger, fed slog records (with their caller) through
	// logr: the header and the quoting are klog's, byte for byte.
	cfg := textlogger.NewConfig(textlogger.Verbosity(o.verbosity), textlogger.Output(w))
	return logr.ToSlogHandler(textlogger.NewLogger(cfg))
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

// applyFlags copies into o the logging flags set on the command line
// (from holds their values): they beat the config file, as upstream's
// copyLogsFromFlags makes them.
func (o *LogOptions) applyFlags(changed func(string) bool, from LogOptions) {
	if changed("log-format") || changed("logging-format") {
		o.format = from.format
	}
	if changed("v") {
		o.verbosity = from.verbosity
	}
	if changed("vmodule") {
		o.vmodule = joinVModule(from.vmodule, o.vmodule)
	}
	if changed("log-flush-frequency") {
		o.flushFrequency = from.flushFrequency
	}
	if changed("log-text-split-stream") {
		o.textSplit = from.textSplit
	}
	if changed("log-json-split-stream") {
		o.jsonSplit = from.jsonSplit
	}
	if changed("log-text-info-buffer-size") {
		o.textBuffer = from.textBuffer
	}
	if changed("log-json-info-buffer-size") {
		o.jsonBuffer = from.jsonBuffer
	}
}

// joinVModule puts the flag's vmodule entries before the file's, as
// upstream joins them (the flag's first, so they win).
func joinVModule(flag, file string) string {
	switch {
	case flag == "":
		return file
	case file == "":
		return flag
	}
	return flag + "," + file
}
