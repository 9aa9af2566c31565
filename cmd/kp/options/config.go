package options

import (
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"

	"github.com/kpproxy/kp/proxy"
)

const (
	configAPIVersion = "kubeproxy.config.k8s.io/v1alpha1"
	configKind       = "KubeProxyConfiguration"
)

// fileConfig is a decoded --config file.
type fileConfig struct {
	path string
	kc   KubeProxyConfiguration
}

// loadConfigFile reads a KubeProxyConfiguration file strictly
// (DecodeKubeProxyConfiguration).
func loadConfigFile(path string) (*fileConfig, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("--config: %w", err)
	}
	kc, err := DecodeKubeProxyConfiguration(data, "--config "+path)
	if err != nil {
		return nil, err
	}
	return &fileConfig{path: path, kc: *kc}, nil
}

// DecodeKubeProxyConfiguration decodes a KubeProxyConfiguration (YAML or
// JSON) strictly: an unknown or duplicated field is an error naming the
// field, so a typo is never silently ignored. Errors start with source
// ("--config /etc/kp.yaml", or the ConfigMap a file came from). It is the
// one decoder of the file: kp proxy --config, and kp migrate cluster
// reading kube-proxy's ConfigMap.
func DecodeKubeProxyConfiguration(data []byte, source string) (*KubeProxyConfiguration, error) {
	fail := func(format string, args ...any) error {
		return fmt.Errorf("%s: %s", source, fmt.Sprintf(format, args...))
	}
	js, err := yaml.YAMLToJSONStrict(data)
	if err != nil {
		return nil, fail("%v", err)
	}
	if strings.TrimSpace(string(js)) == "null" {
		return nil, fail("the file is empty; want a %s", configKind)
	}
	var tm metav1.TypeMeta
	if err := yaml.Unmarshal(js, &tm); err != nil {
		return nil, fail("%v", err)
	}
	if tm.Kind != configKind {
		return nil, fail("kind is %q; want %s", tm.Kind, configKind)
	}
	if tm.APIVersion != configAPIVersion {
		return nil, fail("apiVersion is %q; kp reads %s", tm.APIVersion, configAPIVersion)
	}

	var kc KubeProxyConfiguration
	strictErrs, err := kjson.UnmarshalStrict(js, &kc)
	if err != nil {
		return nil, fail("%v", err)
	}
	if len(strictErrs) > 0 {
		errs := make([]error, len(strictErrs))
		for i, e := range strictErrs {
			errs[i] = fail("%v", e)
		}
		return nil, errors.Join(errs...)
	}
	return &kc, nil
}

// apply merges the file into s (which holds defaults and the resolved mode).
// Zero values mean "default", as upstream's defaulting treats them. Every
// problem is reported, not just the first, so one edit fixes the file.
func (f *fileConfig) apply(s *Settings) []error {
	m := &fileMerge{path: f.path, s: s}
	for _, section := range fileSections {
		section(m, &f.kc)
	}
	return m.errs
}

// fileSections merge the file's parts into the settings, in the order their
// problems are reported and their ignored settings logged.
var fileSections = []func(*fileMerge, *KubeProxyConfiguration){
	(*fileMerge).featureGates,
	(*fileMerge).clientConnection,
	(*fileMerge).logging,
	(*fileMerge).servers,
	(*fileMerge).modeSections,
	(*fileMerge).unsupportedFields,
	(*fileMerge).networks,
	(*fileMerge).conntrack,
	(*fileMerge).configSyncPeriod,
}

// fileMerge is one merge of a file into s: the problems found, and the
// wording of each kind.
type fileMerge struct {
	path string
	s    *Settings
	errs []error
}

func (m *fileMerge) unsupported(field, hint string) {
	m.errs = append(m.errs, fmt.Errorf("--config %s: field %s is not supported by kp%s", m.path, field, hint))
}

func (m *fileMerge) invalid(field string, value any, err error) {
	m.errs = append(m.errs, fmt.Errorf("--config %s: %s %q: %w", m.path, field, fmt.Sprint(value), err))
}

func (m *fileMerge) ignore(field, reason string) {
	m.s.Ignored = append(m.s.Ignored, IgnoredSetting{Name: field + " in " + m.path, Reason: reason})
}

// sectionErrors adds the errors of a section's own check, naming the file.
func (m *fileMerge) sectionErrors(errs []error) {
	for _, err := range errs {
		m.errs = append(m.errs, fmt.Errorf("--config %s: %w", m.path, err))
	}
}

func (m *fileMerge) featureGates(kc *KubeProxyConfiguration) {
	for _, name := range slices.Sorted(maps.Keys(kc.FeatureGates)) {
		if err := checkFeatureGate(name, kc.FeatureGates[name]); err != nil {
			m.unsupported("featureGates."+name, fmt.Sprintf(" (%s=%t); kp accepts %s", name, kc.FeatureGates[name], supportedGatesList()))
		}
	}
}

func (m *fileMerge) clientConnection(kc *KubeProxyConfiguration) {
	cc := kc.ClientConnection
	if cc.Kubeconfig != "" {
		m.s.Config.Kubeconfig = cc.Kubeconfig
	}
	if cc.QPS != 0 || cc.Burst != 0 || cc.ContentType != "" || cc.AcceptContentTypes != "" {
		m.ignore("clientConnection.qps/burst/contentType", "kp sets its own API client rate limits and content type")
	}
}

func (m *fileMerge) logging(kc *KubeProxyConfiguration) {
	switch kc.Logging.Format {
	case "":
	case "text", "json":
		m.s.Log.format = kc.Logging.Format
	default:
		m.invalid("logging.format", kc.Logging.Format, errors.New("kp logs as text or json"))
	}
	m.s.Log.verbosity = int(kc.Logging.Verbosity)
	if len(kc.Logging.VModule) > 0 {
		m.ignore("logging.vmodule", "kp's logs have one verbosity")
	}
}

// servers reads the node's name and what kp's servers bind to.
func (m *fileMerge) servers(kc *KubeProxyConfiguration) {
	s := m.s
	if kc.HostnameOverride != "" {
		s.Config.HostnameOverride = kc.HostnameOverride
	}
	if v6, err := checkBindAddressIP(kc.BindAddress); err != nil {
		m.invalid("bindAddress", kc.BindAddress, err)
	} else {
		s.bindAddressV6 = v6
	}
	for _, a := range []struct {
		field, value string
		dst          *string
	}{
		{"healthzBindAddress", kc.HealthzBindAddress, &s.Config.HealthzBindAddress},
		{"metricsBindAddress", kc.MetricsBindAddress, &s.Config.MetricsBindAddress},
	} {
		if a.value == "" {
			continue
		}
		if err := checkBindAddress(a.value); err != nil {
			m.invalid(a.field, a.value, err)
		}
		*a.dst = a.value
	}
	if kc.BindAddressHardFail {
		m.ignore("bindAddressHardFail", "kp always fails when it cannot bind its servers")
	}
	if kc.EnableProfiling {
		s.Config.Profiling = true
	}
	if kc.ShowHiddenMetricsForVersion != "" {
		m.ignore("showHiddenMetricsForVersion", "kp has no hidden metrics")
	}
}

// modeSections reads the sections of the modes: the masquerade and sync
// settings from the mode in use's, the rest from their own.
func (m *fileMerge) modeSections(kc *KubeProxyConfiguration) {
	s := m.s
	// Upstream reads the masquerade and sync settings from the section of the
	// mode in use; the other sections are ignored.
	mode := modeSection{name: "nftables", masqueradeBit: kc.NFTables.MasqueradeBit, masqueradeAll: kc.NFTables.MasqueradeAll,
		syncPeriod: kc.NFTables.SyncPeriod, minSyncPeriod: kc.NFTables.MinSyncPeriod}
	switch s.Config.Mode {
	case proxy.ModeIPTables, proxy.ModeUserspace:
		mode = modeSection{name: "iptables", masqueradeBit: kc.IPTables.MasqueradeBit, masqueradeAll: kc.IPTables.MasqueradeAll,
			syncPeriod: kc.IPTables.SyncPeriod, minSyncPeriod: kc.IPTables.MinSyncPeriod}
	case proxy.ModeIPVS:
		// Upstream's ipvs mode masquerades with the iptables section's settings.
		mode = modeSection{name: "ipvs", masqueradeBit: kc.IPTables.MasqueradeBit, masqueradeAll: kc.IPTables.MasqueradeAll,
			syncPeriod: kc.IPVS.SyncPeriod, minSyncPeriod: kc.IPVS.MinSyncPeriod}
	}
	m.errs = append(m.errs, mode.apply(m.path, s)...)
	if v := kc.IPTables.LocalhostNodePorts; v != nil {
		s.Config.LocalhostNodePorts = *v
	}
	m.sectionErrors(applyIPVSSection(kc.IPVS, s))
}

// unsupportedFields refuses the Windows and local-traffic settings kp does not
// implement.
func (m *fileMerge) unsupportedFields(kc *KubeProxyConfiguration) {
	for _, u := range []struct {
		field string
		set   bool
	}{
		{"winkernel", kc.Winkernel != KubeProxyWinkernelConfiguration{}},
		{"windowsRunAsService", kc.WindowsRunAsService},
		{"portRange", kc.PortRange != ""},
		{"detectLocal.bridgeInterface", kc.DetectLocal.BridgeInterface != ""},
		{"detectLocal.interfaceNamePrefix", kc.DetectLocal.InterfaceNamePrefix != ""},
	} {
		if u.set {
			m.unsupported(u.field, "; remove it or leave it empty")
		}
	}
	if err := checkDetectLocalMode(string(kc.DetectLocalMode)); err != nil {
		m.unsupported("detectLocalMode", fmt.Sprintf(" with value %s; use ClusterCIDR (or leave it empty) with clusterCIDR", kc.DetectLocalMode))
	}
}

// networks reads the pods' CIDRs and the addresses NodePorts answer on.
func (m *fileMerge) networks(kc *KubeProxyConfiguration) {
	if kc.ClusterCIDR != "" {
		cidrs, err := parseClusterCIDRs(kc.ClusterCIDR)
		if err != nil {
			m.invalid("clusterCIDR", kc.ClusterCIDR, err)
		}
		m.s.Config.ClusterCIDRs = cidrs
	}
	if len(kc.NodePortAddresses) > 0 {
		cidrs, primary, err := parseNodePortAddresses(kc.NodePortAddresses)
		if err != nil {
			m.invalid("nodePortAddresses", strings.Join(kc.NodePortAddresses, ","), err)
		}
		m.s.Config.NodePortAddresses, m.s.Config.NodePortPrimary = cidrs, primary
	}
}

// conntrack reads the node tuning: the conntrack section, and the OOM score
// kp leaves alone.
func (m *fileMerge) conntrack(kc *KubeProxyConfiguration) {
	if kc.OOMScoreAdj != nil {
		m.ignore("oomScoreAdj", "kp does not change its own OOM score; set it through the pod")
	}
	m.sectionErrors(applyConntrackSection(kc.Conntrack, m.s))
}

func (m *fileMerge) configSyncPeriod(kc *KubeProxyConfiguration) {
	if d := kc.ConfigSyncPeriod.Duration; d != 0 {
		if err := checkDuration(d, false); err != nil {
			m.invalid("configSyncPeriod", d, err)
		}
		m.s.Config.ConfigSyncPeriod = d
	}
}

// modeSection is the part of one mode's section (nftables, iptables, ipvs)
// that maps onto proxy.Config.
type modeSection struct {
	name                      string
	masqueradeBit             *int32
	masqueradeAll             bool
	syncPeriod, minSyncPeriod metav1.Duration
}

func (m modeSection) apply(path string, s *Settings) []error {
	var errs []error
	invalid := func(field string, value any, err error) {
		errs = append(errs, fmt.Errorf("--config %s: %s.%s %q: %w", path, m.name, field, fmt.Sprint(value), err))
	}
	if m.masqueradeBit != nil {
		if err := checkMasqueradeBit(*m.masqueradeBit); err != nil {
			invalid("masqueradeBit", *m.masqueradeBit, err)
		}
		s.Config.MasqueradeBit = int(*m.masqueradeBit)
	}
	if m.masqueradeAll {
		s.Config.MasqueradeAll = true
	}
	for _, d := range []struct {
		field string
		value time.Duration
		dst   *time.Duration
	}{
		{"syncPeriod", m.syncPeriod.Duration, &s.Config.SyncPeriod},
		{"minSyncPeriod", m.minSyncPeriod.Duration, &s.Config.MinSyncPeriod},
	} {
		// 0 is "unset": upstream's defaulting replaces it too.
		if d.value == 0 {
			continue
		}
		if err := checkDuration(d.value, false); err != nil {
			invalid(d.field, d.value, err)
		}
		*d.dst = d.value
	}
	return errs
}
