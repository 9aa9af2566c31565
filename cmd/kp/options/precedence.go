package options

import (
	"github.com/spf13/pflag"
)

// Upstream's precedence between its flags and its --config file: without
// the file, every flag applies; with it, the file replaces the whole
// configuration the flags built, and only what lives outside the file
// survives: --hostname-override (which beats the file's hostnameOverride),
// --master, the logging flags (copied over the file's logging section), and
// the flags that only say what to do (--config, --write-config-to,
// --cleanup, --init-only, --version). Every other upstream flag is ignored,
// however it was set; kp ignores it too, and logs each one set as a
// warning, since a leftover DaemonSet argument that silently does nothing
// is what an operator most needs to hear about.
//
// kp's own flags (--manifests, --service-cidrs, --iptables-backend,
// --userspace-*, --sync-period, ...) have no field in the file and are in
// force either way.

// upstreamFlagsWithConfig are the upstream flags in force beside --config.
var upstreamFlagsWithConfig = map[string]bool{
	"config": true, "write-config-to": true, "cleanup": true, "init-only": true, "version": true, "help": true,
	"hostname-override": true, "master": true,
	"v": true, "vmodule": true, "logging-format": true, "log-flush-frequency": true,
	"log-text-split-stream": true, "log-text-info-buffer-size": true,
	"log-json-split-stream": true, "log-json-info-buffer-size": true,
	// cadvisor's, in upstream's binary through the Go flag set: no field.
	"boot-id-file": true, "machine-id-file": true,
}

// isUpstreamFlag reports whether upstream kube-proxy has a flag of that name.
func isUpstreamFlag(name string) bool {
	for _, f := range upstreamFlags {
		if f.name == name {
			return true
		}
	}
	return false
}

// inForceWithConfig reports whether a flag applies beside --config.
func inForceWithConfig(name string) bool {
	return !isUpstreamFlag(name) || upstreamFlagsWithConfig[name]
}

// flagsInForce returns the "was this flag set, and does it apply" test the
// merge uses, and records in s each flag set that --config makes kube-proxy
// (so kp) ignore.
func (o *Options) flagsInForce(fs *pflag.FlagSet, withConfig bool, s *Settings) func(string) bool {
	if !withConfig {
		return fs.Changed
	}
	fs.Visit(func(f *pflag.Flag) {
		if !inForceWithConfig(f.Name) {
			s.Ignored = append(s.Ignored, IgnoredSetting{Name: "--" + f.Name + "=" + f.Value.String(), Warn: true,
				Reason: "--config is set, and kube-proxy ignores this flag then: set it in the file"})
		}
	})
	return func(name string) bool { return fs.Changed(name) && inForceWithConfig(name) }
}
