package options

import (
	"fmt"
	"net/netip"
	"os"
	"strings"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"
)

// WriteConfig writes s as a KubeProxyConfiguration to path, as upstream's
// --write-config-to does: the effective configuration (defaults, then the
// file or the flags), every field written, keys in upstream's (sorted)
// order, so the file reads back into the same settings. It returns the
// settings the file cannot hold (kp's own flags), for the log.
func WriteConfig(path string, s Settings) (notWritten []string, err error) {
	data, err := yaml.Marshal(s.kubeProxyConfiguration())
	if err != nil {
		return nil, fmt.Errorf("--write-config-to: %w", err)
	}
	if err := os.WriteFile(path, data, 0o644); err != nil {
		return nil, fmt.Errorf("--write-config-to: %w", err)
	}
	return s.kpOnly(), nil
}

// kubeProxyConfiguration is s in the file's types.
func (s Settings) kubeProxyConfiguration() *KubeProxyConfiguration {
	c := s.Config
	kc := &KubeProxyConfiguration{
		TypeMeta:     metav1.TypeMeta{APIVersion: configAPIVersion, Kind: configKind},
		FeatureGates: s.featureGates,
		ClientConnection: ClientConnectionConfiguration{Kubeconfig: c.Kubeconfig,
			// Upstream's defaults: kp uses its own, and ignores these.
			ContentType: "application/vnd.kubernetes.protobuf", QPS: 5, Burst: 10},
		Logging:            s.Log.loggingConfiguration(),
		BindAddress:        "0.0.0.0",
		HealthzBindAddress: c.HealthzBindAddress,
		MetricsBindAddress: c.MetricsBindAddress,
		EnableProfiling:    c.Profiling,
		DetectLocalMode:    LocalMode(c.DetectLocal.Mode),
		DetectLocal: DetectLocalConfiguration{BridgeInterface: c.DetectLocal.BridgeInterface,
			InterfaceNamePrefix: c.DetectLocal.InterfaceNamePrefix},
		ClusterCIDR:      joinPrefixes(c.ClusterCIDRs),
		Conntrack:        s.conntrackSection(),
		ConfigSyncPeriod: metav1.Duration{Duration: c.ConfigSyncPeriod},
	}
	if s.nameGiven {
		kc.HostnameOverride = c.HostnameOverride
	}
	if s.bindAddressV6 {
		kc.BindAddress = "::"
	}
	if !s.Auto { // auto stays auto: the field empty
		kc.Mode = ProxyMode(c.Mode)
	}
	bit := int32(c.MasqueradeBit)
	sync := metav1.Duration{Duration: c.SyncPeriod}
	minSync := metav1.Duration{Duration: c.MinSyncPeriod}
	localhost := c.LocalhostNodePorts
	// The sync periods go to every mode's section: each mode (auto tries
	// several) reads its own.
	kc.IPTables = KubeProxyIPTablesConfiguration{MasqueradeBit: &bit, MasqueradeAll: c.MasqueradeAll,
		LocalhostNodePorts: &localhost, SyncPeriod: sync, MinSyncPeriod: minSync}
	kc.NFTables = KubeProxyNFTablesConfiguration{MasqueradeBit: &bit, MasqueradeAll: c.MasqueradeAll,
		SyncPeriod: sync, MinSyncPeriod: minSync}
	kc.IPVS = KubeProxyIPVSConfiguration{SyncPeriod: sync, MinSyncPeriod: minSync, Scheduler: c.IPVS.Scheduler,
		ExcludeCIDRs: prefixStrings(c.IPVS.ExcludeCIDRs), StrictARP: c.IPVS.StrictARP,
		TCPTimeout: metav1.Duration{Duration: c.IPVS.TCPTimeout}, TCPFinTimeout: metav1.Duration{Duration: c.IPVS.TCPFinTimeout},
		UDPTimeout: metav1.Duration{Duration: c.IPVS.UDPTimeout}}
	switch {
	case c.NodePortPrimary && len(c.NodePortAddresses) == 0:
		kc.NodePortAddresses = []string{"primary"}
	default:
		kc.NodePortAddresses = prefixStrings(c.NodePortAddresses)
	}
	return kc
}

func (s Settings) conntrackSection() KubeProxyConntrackConfiguration {
	t := s.Conntrack
	maxPerCore, minimum := t.MaxPerCore, t.Min
	return KubeProxyConntrackConfiguration{
		MaxPerCore:            &maxPerCore,
		Min:                   &minimum,
		TCPEstablishedTimeout: &metav1.Duration{Duration: t.TCPEstablishedTimeout},
		TCPCloseWaitTimeout:   &metav1.Duration{Duration: t.TCPCloseWaitTimeout},
		TCPBeLiberal:          t.TCPBeLiberal,
		UDPTimeout:            metav1.Duration{Duration: t.UDPTimeout},
		UDPStreamTimeout:      metav1.Duration{Duration: t.UDPStreamTimeout},
	}
}

func (o LogOptions) loggingConfiguration() LoggingConfiguration {
	l := LoggingConfiguration{Format: o.format, Verbosity: VerbosityLevel(o.verbosity),
		FlushFrequency: TimeOrMetaDuration{Duration: metav1.Duration{Duration: o.flushFrequency}, SerializeAsString: true}}
	vm, _ := parseVModule(o.vmodule)
	for _, item := range strings.Split(o.vmodule, ",") {
		pattern, _, _ := strings.Cut(item, "=")
		if v, ok := vm[pattern]; ok {
			l.VModule = append(l.VModule, VModuleItem{FilePattern: pattern, Verbosity: VerbosityLevel(v)})
		}
	}
	l.Options.Text.SplitStream, l.Options.JSON.SplitStream = o.textSplit, o.jsonSplit
	l.Options.Text.InfoBufferSize = quantityValue(o.textBuffer)
	l.Options.JSON.InfoBufferSize = quantityValue(o.jsonBuffer)
	return l
}

func quantityValue(q quantity) resource.QuantityValue {
	v, err := resource.ParseQuantity(string(q))
	if err != nil {
		v = resource.MustParse("0")
	}
	return resource.QuantityValue{Quantity: v}
}

// kpOnly lists the settings of s that have no field in the file.
func (s Settings) kpOnly() []string {
	c, d := s.Config, DefaultSettings().Config
	var out []string
	add := func(set bool, name string) {
		if set {
			out = append(out, name)
		}
	}
	add(c.ManifestsDir != "", "--manifests")
	add(c.Master != "", "--master")
	add(len(c.ServiceCIDRs) > 0, "--service-cidrs")
	add(c.IPTablesBackend != d.IPTablesBackend, "--iptables-backend")
	add(c.DriftCheckPeriod != d.DriftCheckPeriod, "--drift-check-period")
	add(c.UserspaceRedirect != d.UserspaceRedirect || c.UserspaceMaxConnections != d.UserspaceMaxConnections ||
		c.UserspaceTCPIdleTimeout != d.UserspaceTCPIdleTimeout || c.UserspaceUDPIdleTimeout != d.UserspaceUDPIdleTimeout,
		"--userspace-*")
	return out
}

func joinPrefixes(ps []netip.Prefix) string { return strings.Join(prefixStrings(ps), ",") }

func prefixStrings(ps []netip.Prefix) []string {
	var out []string
	for _, p := range ps {
		out = append(out, p.String())
	}
	return out
}
