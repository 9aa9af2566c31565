// Package options turns kp proxy's command line and KubeProxyConfiguration
// file into Settings: upstream kube-proxy's flags and their compatibility
// rules, the --config file's decoder, the logging setup, and the resolution
// of the proxy mode (with, for auto, the settings of each candidate mode).
// It acts on nothing: cmd/kp starts the backends, the sources and the
// servers from the Settings.
package options
