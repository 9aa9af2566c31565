package options

import (
	"bytes"
	"errors"
	"fmt"
	"maps"
	"os"
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
	data []byte // as read
	kc   KubeProxyConfiguration
	// lenient is the warning when the file decoded only leniently.
	lenient []IgnoredSetting
}

// loadConfigFile reads a --config file (decodeConfig).
func loadConfigFile(path string) (*fileConfig, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("--config: %w", err)
	}
	f, err := decodeConfig(data, "--config "+path)
	if err != nil {
		return nil, err
	}
	f.path = path
	return f, nil
}

// DecodeKubeProxyConfiguration decodes a KubeProxyConfiguration (YAML or
// JSON) as kube-proxy does (decodeConfig); errors start with source
// ("--config /etc/kp.yaml", or the ConfigMap a file came from). It is the
// one decoder of the file: kp proxy --config, and kp migrate cluster
// reading kube-proxy's ConfigMap and kp's. What decoded only leniently is
// returned as a warning, as kp proxy logs it.
func DecodeKubeProxyConfiguration(data []byte, source string) (*KubeProxyConfiguration, []IgnoredSetting, error) {
	f, err := decodeConfig(data, source)
	if err != nil {
		return nil, nil, err
	}
	return &f.kc, f.lenient, nil
}

// decodeConfig reads a KubeProxyConfiguration as upstream does: strictly
// first; when only strictness fails (an unknown field, a field twice),
// leniently (unknown fields dropped, the last of a duplicate kept) with a
// warning naming every such field. What fails leniently too (YAML syntax, a
// value of the wrong type, the wrong kind or apiVersion) is an error.
func decodeConfig(data []byte, source string) (*fileConfig, error) {
	fail := func(format string, args ...any) error {
		return fmt.Errorf("%s: %s", source, fmt.Sprintf(format, args...))
	}
	// JSON is read as JSON (a duplicated key is then the JSON decoder's to
	// find), anything else as YAML, as upstream's decoder tells them apart.
	isJSON := bytes.HasPrefix(bytes.TrimLeft(data, " \t\r\n"), []byte("{"))
	js := data
	if !isJSON {
		var err error
		if js, err = yaml.YAMLToJSON(data); err != nil {
			return nil, fail("%v", err)
		}
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

	f := &fileConfig{path: source, data: data}
	var strictErrs []error
	if _, err := yaml.YAMLToJSONStrict(data); err != nil && !isJSON {
		strictErrs = append(strictErrs, err)
	}
	jsonErrs, err := kjson.UnmarshalStrict(js, &f.kc)
	if err != nil {
		return nil, fail("%v", err)
	}
	strictErrs = append(strictErrs, jsonErrs...)
	if len(strictErrs) == 0 {
		return f, nil
	}
	f.kc = KubeProxyConfiguration{}
	if err := kjson.UnmarshalCaseSensitivePreserveInts(js, &f.kc); err != nil {
		return nil, fail("%v", err)
	}
	msgs := make([]string, len(strictErrs))
	for i, e := range strictErrs {
		msgs[i] = e.Error()
	}
	f.lenient = []IgnoredSetting{{Name: source, Warn: true,
		Reason: "strict decoding error: " + strings.Join(msgs, ", ") + "; decoded leniently, as kube-proxy does " +
			"(unknown fields dropped, the last of a duplicated field kept)"}}
	return f, nil
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

// featureGates takes the file's gates (upstream ignores --feature-gates
// beside --config); Settings.finish checks them.
func (m *fileMerge) featureGates(kc *KubeProxyConfiguration) {
	m.s.featureGates = maps.Clone(kc.FeatureGates)
	m.s.featureGatesFrom = "--config " + m.path + ": featureGates"
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
	l, log := kc.Logging, &m.s.Log
	switch l.Format {
	case "":
	case "text", "json":
		log.format = l.Format
	default:
		m.invalid("logging.format", l.Format, errors.New("kp logs as text or json"))
	}
	log.verbosity = int(l.Verbosity)
	var vmodule []string
	for _, v := range l.VModule {
		vmodule = append(vmodule, fmt.Sprintf("%s=%d", v.FilePattern, v.Verbosity))
	}
	log.vmodule = strings.Join(vmodule, ",")
	if d := l.FlushFrequency.Duration.Duration; d != 0 {
		log.flushFrequency = d
	}
	log.textSplit, log.jsonSplit = l.Options.Text.SplitStream, l.Options.JSON.SplitStream
	log.textBuffer = quantity(l.Options.Text.InfoBufferSize.String())
	log.jsonBuffer = quantity(l.Options.JSON.InfoBufferSize.String())
	if len(l.VModule) > 0 {
		m.ignore("logging.vmodule", "kp's logs have one verbosity")
	}
	if !log.textBuffer.zero() || !log.jsonBuffer.zero() {
		m.ignore("logging.options.*.infoBufferSize", "kp does not buffer its logs")
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
	// A bare IP takes the server's usual port, as upstream's defaulting
	// of the file does (appendPortIfNeeded).
	for _, a := range []struct {
		field, value string
		port         int32
		dst          *string
	}{
		{"healthzBindAddress", kc.HealthzBindAddress, healthzPort, &s.Config.HealthzBindAddress},
		{"metricsBindAddress", kc.MetricsBindAddress, metricsPort, &s.Config.MetricsBindAddress},
	} {
		if a.value == "" {
			continue
		}
		addr := appendPortIfNeeded(a.value, a.port)
		if err := checkBindAddress(addr); err != nil {
			m.invalid(a.field, a.value, err)
		}
		*a.dst = addr
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

// unsupportedFields refuses the Windows settings kp does not implement, and
// reads how local traffic is detected.
func (m *fileMerge) unsupportedFields(kc *KubeProxyConfiguration) {
	for _, u := range []struct {
		field string
		set   bool
	}{
		{"winkernel", kc.Winkernel != KubeProxyWinkernelConfiguration{}},
		{"windowsRunAsService", kc.WindowsRunAsService},
		{"portRange", kc.PortRange != ""},
	} {
		if u.set {
			m.unsupported(u.field, "; remove it or leave it empty")
		}
	}
	mode, err := parseLocalMode(string(kc.DetectLocalMode))
	if err != nil {
		m.invalid("detectLocalMode", kc.DetectLocalMode, err)
	}
	m.s.Config.DetectLocal.Mode = mode
	m.s.Config.DetectLocal.BridgeInterface = kc.DetectLocal.BridgeInterface
	m.s.Config.DetectLocal.InterfaceNamePrefix = kc.DetectLocal.InterfaceNamePrefix
}

// networks reads the pods' CIDRs and the addresses NodePorts answer on.
func (m *fileMerge) networks(kc *KubeProxyConfiguration) {
	if kc.ClusterCIDR != "" {
		cidrs, err := parseClusterCIDRs(kc.ClusterCIDR)
		if strings.Contains(kc.ClusterCIDR, PlaceholderClusterCIDR) {
			err = errors.New("still manifests/configmap.yaml's placeholder: set the cluster's pod CIDR(s), comma-separated, " +
				"in kp's ConfigMap (kube-system/kp in manifests/), key config.conf; kp migrate cluster --from-kube-proxy " +
				"--print-config writes the ConfigMap from kube-proxy's")
		}
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
