package options

import (
	"encoding/json"
	"fmt"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// This file mirrors upstream's KubeProxyConfiguration, apiVersion
// kubeproxy.config.k8s.io/v1alpha1 (k8s.io/kube-proxy/config/v1alpha1 at
// v0.36.3, with the component-base types it embeds), which kp reads as its
// --config file.
//
// Why a copy: upstream's package would link k8s.io/component-base and
// OpenTelemetry into every kp process (the cost: test/bench/NOTES.md).
//
// kp decodes the file strictly, so every upstream field is here, the ones kp
// ignores or refuses included: a valid upstream file must decode. Names,
// JSON tags, Go types and field order are upstream's; the one visible
// difference is that a value of the wrong JSON type for a field of a named
// type is reported with the mirror's type name (options.ProxyMode where
// upstream says v1alpha1.ProxyMode).
//
// The tests in kubeproxyconfig_test.go, which may import upstream's package,
// keep the two in step: TestKubeProxyConfigurationMirrorsUpstreamFields
// fails, naming the path, when the trees of JSON fields differ, and
// TestKubeProxyConfigurationRoundTripsUpstreamObject decodes a fully
// populated upstream object strictly into the mirror and back.

// KubeProxyConfiguration contains everything necessary to configure the
// Kubernetes proxy server.
type KubeProxyConfiguration struct {
	metav1.TypeMeta `json:",inline"`

	FeatureGates map[string]bool `json:"featureGates,omitempty"`

	ClientConnection ClientConnectionConfiguration `json:"clientConnection"`
	Logging          LoggingConfiguration          `json:"logging,omitempty"`

	HostnameOverride            string `json:"hostnameOverride"`
	BindAddress                 string `json:"bindAddress"`
	HealthzBindAddress          string `json:"healthzBindAddress"`
	MetricsBindAddress          string `json:"metricsBindAddress"`
	BindAddressHardFail         bool   `json:"bindAddressHardFail"`
	EnableProfiling             bool   `json:"enableProfiling"`
	ShowHiddenMetricsForVersion string `json:"showHiddenMetricsForVersion"`

	Mode      ProxyMode                       `json:"mode"`
	IPTables  KubeProxyIPTablesConfiguration  `json:"iptables"`
	IPVS      KubeProxyIPVSConfiguration      `json:"ipvs"`
	NFTables  KubeProxyNFTablesConfiguration  `json:"nftables"`
	Winkernel KubeProxyWinkernelConfiguration `json:"winkernel"`

	DetectLocalMode LocalMode                `json:"detectLocalMode"`
	DetectLocal     DetectLocalConfiguration `json:"detectLocal"`
	ClusterCIDR     string                   `json:"clusterCIDR"`

	NodePortAddresses []string `json:"nodePortAddresses"`

	OOMScoreAdj      *int32                          `json:"oomScoreAdj"`
	Conntrack        KubeProxyConntrackConfiguration `json:"conntrack"`
	ConfigSyncPeriod metav1.Duration                 `json:"configSyncPeriod"`

	PortRange string `json:"portRange"`

	WindowsRunAsService bool `json:"windowsRunAsService,omitempty"`
}

// ProxyMode is a proxy mode's name: iptables, ipvs, nftables, kernelspace.
type ProxyMode string

// LocalMode is a way of detecting traffic from local pods.
type LocalMode string

// KubeProxyIPTablesConfiguration is the iptables: section.
type KubeProxyIPTablesConfiguration struct {
	MasqueradeBit      *int32          `json:"masqueradeBit"`
	MasqueradeAll      bool            `json:"masqueradeAll"`
	LocalhostNodePorts *bool           `json:"localhostNodePorts"`
	SyncPeriod         metav1.Duration `json:"syncPeriod"`
	MinSyncPeriod      metav1.Duration `json:"minSyncPeriod"`
}

// KubeProxyIPVSConfiguration is the ipvs: section.
type KubeProxyIPVSConfiguration struct {
	SyncPeriod    metav1.Duration `json:"syncPeriod"`
	MinSyncPeriod metav1.Duration `json:"minSyncPeriod"`
	Scheduler     string          `json:"scheduler"`
	ExcludeCIDRs  []string        `json:"excludeCIDRs"`
	StrictARP     bool            `json:"strictARP"`
	TCPTimeout    metav1.Duration `json:"tcpTimeout"`
	TCPFinTimeout metav1.Duration `json:"tcpFinTimeout"`
	UDPTimeout    metav1.Duration `json:"udpTimeout"`
}

// KubeProxyNFTablesConfiguration is the nftables: section.
type KubeProxyNFTablesConfiguration struct {
	MasqueradeBit *int32          `json:"masqueradeBit"`
	MasqueradeAll bool            `json:"masqueradeAll"`
	SyncPeriod    metav1.Duration `json:"syncPeriod"`
	MinSyncPeriod metav1.Duration `json:"minSyncPeriod"`
}

// KubeProxyConntrackConfiguration is the conntrack: section.
type KubeProxyConntrackConfiguration struct {
	MaxPerCore            *int32           `json:"maxPerCore"`
	Min                   *int32           `json:"min"`
	TCPEstablishedTimeout *metav1.Duration `json:"tcpEstablishedTimeout"`
	TCPCloseWaitTimeout   *metav1.Duration `json:"tcpCloseWaitTimeout"`
	TCPBeLiberal          bool             `json:"tcpBeLiberal"`
	UDPTimeout            metav1.Duration  `json:"udpTimeout"`
	UDPStreamTimeout      metav1.Duration  `json:"udpStreamTimeout"`
}

// KubeProxyWinkernelConfiguration is the winkernel: section (Windows; kp
// refuses it when set).
type KubeProxyWinkernelConfiguration struct {
	NetworkName           string `json:"networkName"`
	SourceVip             string `json:"sourceVip"`
	EnableDSR             bool   `json:"enableDSR"`
	RootHnsEndpointName   string `json:"rootHnsEndpointName"`
	ForwardHealthCheckVip bool   `json:"forwardHealthCheckVip"`
}

// DetectLocalConfiguration is the detectLocal: section.
type DetectLocalConfiguration struct {
	BridgeInterface     string `json:"bridgeInterface"`
	InterfaceNamePrefix string `json:"interfaceNamePrefix"`
}

// ClientConnectionConfiguration is the clientConnection: section
// (component-base's config/v1alpha1).
type ClientConnectionConfiguration struct {
	Kubeconfig         string  `json:"kubeconfig"`
	AcceptContentTypes string  `json:"acceptContentTypes"`
	ContentType        string  `json:"contentType"`
	QPS                float32 `json:"qps"`
	Burst              int32   `json:"burst"`
}

// LoggingConfiguration is the logging: section (component-base's
// logs/api/v1).
type LoggingConfiguration struct {
	Format         string               `json:"format,omitempty"`
	FlushFrequency TimeOrMetaDuration   `json:"flushFrequency"`
	Verbosity      VerbosityLevel       `json:"verbosity"`
	VModule        VModuleConfiguration `json:"vmodule,omitempty"`
	Options        FormatOptions        `json:"options,omitempty"`
}

// TimeOrMetaDuration is logging.flushFrequency: a duration string ("5s") or,
// for older files, a number of nanoseconds. It is written back in the form
// it was read in, as component-base's type of the same name does.
type TimeOrMetaDuration struct {
	Duration          metav1.Duration
	SerializeAsString bool `json:"-"`
}

// MarshalJSON writes the duration as a string or as nanoseconds, as it was
// read.
func (t TimeOrMetaDuration) MarshalJSON() ([]byte, error) {
	if t.SerializeAsString {
		return t.Duration.MarshalJSON()
	}
	return json.Marshal(t.Duration.Duration)
}

// UnmarshalJSON reads a duration string or a number of nanoseconds; the
// error message is component-base's.
func (t *TimeOrMetaDuration) UnmarshalJSON(b []byte) error {
	if len(b) > 0 && b[0] == '"' {
		t.SerializeAsString = true
		return json.Unmarshal(b, &t.Duration)
	}
	t.SerializeAsString = false
	if err := json.Unmarshal(b, &t.Duration.Duration); err != nil {
		return fmt.Errorf("invalid duration %q: %w", string(b), err)
	}
	return nil
}

// VerbosityLevel is a klog verbosity.
type VerbosityLevel uint32

// VModuleConfiguration is logging.vmodule: per-file verbosities.
type VModuleConfiguration []VModuleItem

// VModuleItem is one logging.vmodule entry.
type VModuleItem struct {
	FilePattern string         `json:"filePattern"`
	Verbosity   VerbosityLevel `json:"verbosity"`
}

// FormatOptions is logging.options: settings of the text and json formats.
type FormatOptions struct {
	Text TextOptions `json:"text,omitempty"`
	JSON JSONOptions `json:"json,omitempty"`
}

// TextOptions is logging.options.text.
type TextOptions struct {
	OutputRoutingOptions `json:",inline"`
}

// JSONOptions is logging.options.json.
type JSONOptions struct {
	OutputRoutingOptions `json:",inline"`
}

// OutputRoutingOptions are where a log format writes, and its buffer.
type OutputRoutingOptions struct {
	SplitStream    bool                   `json:"splitStream,omitempty"`
	InfoBufferSize resource.QuantityValue `json:"infoBufferSize,omitempty"`
}
