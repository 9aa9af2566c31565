package options

import (
	"fmt"
	"io"
	"time"

	"github.com/spf13/pflag"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// KubeProxyArgs is upstream kube-proxy's command line as upstream reads it
// (cmd/kube-proxy/app/options.go): with --config, the file, and every other
// flag but --hostname-override and the logging ones is ignored; without it,
// the flags bound to the fields of a KubeProxyConfiguration. kp migrate
// cluster reads a kube-proxy DaemonSet's arguments with it.
type KubeProxyArgs struct {
	// ConfigFile is --config's path ("" without it).
	ConfigFile string
	// Flags is the configuration the flags make when there is no --config:
	// each flag set is written to its field as upstream binds it, the rest
	// stay zero (which the file's readers take as upstream's defaults).
	Flags *KubeProxyConfiguration
	// Master is --master, which overrides the kubeconfig's server.
	Master string
	// HostnameOverride is --hostname-override, which beats the file's.
	HostnameOverride string
}

// ParseKubeProxyArgs reads kube-proxy's arguments (without the program's
// name). Flags kp does not know of (logging, --cleanup, --init-only) are
// skipped, as kube-proxy's own flags would take them; a flag with a value
// its type refuses is an error naming it.
func ParseKubeProxyArgs(args []string) (KubeProxyArgs, error) {
	var out KubeProxyArgs
	kc := &KubeProxyConfiguration{}
	fs := pflag.NewFlagSet("kube-proxy", pflag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.ParseErrorsAllowlist.UnknownFlags = true
	fs.StringVar(&out.ConfigFile, "config", "", "")
	fs.StringVar(&out.Master, "master", "", "")
	fs.StringVar(&out.HostnameOverride, "hostname-override", "", "")
	set := bindKubeProxyFlags(fs, kc)
	if err := fs.Parse(args); err != nil {
		return out, fmt.Errorf("kube-proxy's arguments: %w", err)
	}
	if out.ConfigFile != "" {
		return out, nil
	}
	kc.HostnameOverride = out.HostnameOverride
	set(fs.Changed)
	out.Flags = kc
	return out, nil
}

// bindKubeProxyFlags binds upstream's flags to kc's fields. The pointer
// fields (nil: upstream's default) and the ones a flag fills in more than
// one section are set by the function it returns, once the flags are
// parsed, for the flags set.
func bindKubeProxyFlags(fs *pflag.FlagSet, kc *KubeProxyConfiguration) func(changed func(string) bool) {
	ct := &kc.Conntrack
	fs.StringVar(&kc.ClientConnection.Kubeconfig, "kubeconfig", "", "")
	fs.StringVar(&kc.BindAddress, "bind-address", "", "")
	fs.StringVar(&kc.HealthzBindAddress, "healthz-bind-address", "", "")
	fs.StringVar(&kc.MetricsBindAddress, "metrics-bind-address", "", "")
	fs.BoolVar(&kc.BindAddressHardFail, "bind-address-hard-fail", false, "")
	fs.BoolVar(&kc.EnableProfiling, "profiling", false, "")
	fs.StringVar((*string)(&kc.Mode), "proxy-mode", "", "")
	fs.StringVar(&kc.IPVS.Scheduler, "ipvs-scheduler", "", "")
	fs.StringSliceVar(&kc.IPVS.ExcludeCIDRs, "ipvs-exclude-cidrs", nil, "")
	fs.BoolVar(&kc.IPVS.StrictARP, "ipvs-strict-arp", false, "")
	fs.DurationVar(&kc.IPVS.TCPTimeout.Duration, "ipvs-tcp-timeout", 0, "")
	fs.DurationVar(&kc.IPVS.TCPFinTimeout.Duration, "ipvs-tcpfin-timeout", 0, "")
	fs.DurationVar(&kc.IPVS.UDPTimeout.Duration, "ipvs-udp-timeout", 0, "")
	fs.DurationVar(&kc.IPVS.SyncPeriod.Duration, "ipvs-sync-period", 0, "")
	fs.DurationVar(&kc.IPVS.MinSyncPeriod.Duration, "ipvs-min-sync-period", 0, "")
	fs.StringVar((*string)(&kc.DetectLocalMode), "detect-local-mode", "", "")
	fs.StringVar(&kc.DetectLocal.BridgeInterface, "pod-bridge-interface", "", "")
	fs.StringVar(&kc.DetectLocal.InterfaceNamePrefix, "pod-interface-name-prefix", "", "")
	fs.StringVar(&kc.ClusterCIDR, "cluster-cidr", "", "")
	fs.StringSliceVar(&kc.NodePortAddresses, "nodeport-addresses", nil, "")
	fs.BoolVar(&ct.TCPBeLiberal, "conntrack-tcp-be-liberal", false, "")
	fs.DurationVar(&ct.UDPTimeout.Duration, "conntrack-udp-timeout", 0, "")
	fs.DurationVar(&ct.UDPStreamTimeout.Duration, "conntrack-udp-timeout-stream", 0, "")
	fs.DurationVar(&kc.ConfigSyncPeriod.Duration, "config-sync-period", 0, "")
	gates := featureGates{}
	fs.Var(&gates, "feature-gates", "")

	var masqBit, oom, maxPerCore, minimum int32
	var masqAll, localhost bool
	var established, closeWait, sync, minSync time.Duration
	var hzPort, mPort int32
	fs.Int32Var(&masqBit, "iptables-masquerade-bit", 0, "")
	fs.BoolVar(&masqAll, "masquerade-all", false, "")
	fs.BoolVar(&localhost, "iptables-localhost-nodeports", true, "")
	fs.DurationVar(&sync, "iptables-sync-period", 0, "")
	fs.DurationVar(&minSync, "iptables-min-sync-period", 0, "")
	fs.Int32Var(&oom, "oom-score-adj", 0, "")
	fs.Int32Var(&maxPerCore, "conntrack-max-per-core", 0, "")
	fs.Int32Var(&minimum, "conntrack-min", 0, "")
	fs.DurationVar(&established, "conntrack-tcp-timeout-established", 0, "")
	fs.DurationVar(&closeWait, "conntrack-tcp-timeout-close-wait", 0, "")
	fs.Int32Var(&hzPort, "healthz-port", healthzPort, "")
	fs.Int32Var(&mPort, "metrics-port", metricsPort, "")

	return func(changed func(string) bool) {
		int32s := []struct {
			flag string
			v    int32
			dst  **int32
		}{
			{"iptables-masquerade-bit", masqBit, &kc.IPTables.MasqueradeBit},
			{"oom-score-adj", oom, &kc.OOMScoreAdj},
			{"conntrack-max-per-core", maxPerCore, &ct.MaxPerCore},
			{"conntrack-min", minimum, &ct.Min},
		}
		for _, f := range int32s {
			if changed(f.flag) {
				*f.dst = &f.v
			}
		}
		if changed("iptables-localhost-nodeports") {
			kc.IPTables.LocalhostNodePorts = &localhost
		}
		if changed("conntrack-tcp-timeout-established") {
			ct.TCPEstablishedTimeout = durationPtr(established)
		}
		if changed("conntrack-tcp-timeout-close-wait") {
			ct.TCPCloseWaitTimeout = durationPtr(closeWait)
		}
		// Upstream's flag sets the one masquerade-all of its internal
		// configuration, which either section means in the file.
		kc.IPTables.MasqueradeAll, kc.NFTables.MasqueradeAll = masqAll, masqAll
		// The iptables names set the period of every mode but ipvs.
		if changed("iptables-sync-period") {
			kc.IPTables.SyncPeriod.Duration, kc.NFTables.SyncPeriod.Duration = sync, sync
		}
		if changed("iptables-min-sync-period") {
			kc.IPTables.MinSyncPeriod.Duration, kc.NFTables.MinSyncPeriod.Duration = minSync, minSync
		}
		// Upstream's Complete without --config (addressFromDeprecatedFlags):
		// a bare IP takes the port flag's port, an address with a port
		// (upstream's default one too) keeps it; port 0 disables the
		// server, which a file cannot say ("" is the default there).
		kc.HealthzBindAddress = portAddress(kc.HealthzBindAddress, hzPort)
		kc.MetricsBindAddress = portAddress(kc.MetricsBindAddress, mPort)
		if len(gates) > 0 {
			kc.FeatureGates = gates
		}
	}
}

// portAddress is upstream's addressFromDeprecatedFlags for the address a
// flag gave ("" for upstream's default).
func portAddress(addr string, port int32) string {
	if port == 0 {
		return ""
	}
	return appendPortIfNeeded(addr, port)
}

func durationPtr(d time.Duration) *metav1.Duration { return &metav1.Duration{Duration: d} }
