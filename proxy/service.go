package proxy

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
)

// LabelServiceProxyName hands a Service to another proxy: upstream kube-proxy,
// and kp, ignore every Service that carries it, whatever its value.
const LabelServiceProxyName = "service.kubernetes.io/service-proxy-name"

// ShouldSkipService reports whether a node proxy ignores svc entirely, as
// upstream kube-proxy does: headless Services (clusterIP None), ExternalName
// Services, and Services labelled for another proxy. Ignoring is not an error.
func ShouldSkipService(svc *v1.Service) bool {
	if _, ok := svc.Labels[LabelServiceProxyName]; ok {
		return true
	}
	return svc.Spec.Type == v1.ServiceTypeExternalName || svc.Spec.ClusterIP == v1.ClusterIPNone
}

// ServicePortsFromService converts a Service into one ServicePort per entry
// of spec.ports. It returns nil, nil for Services a node proxy ignores (see
// ShouldSkipService).
//
// Invalid input never rejects the whole Service when part of it is usable:
// every invalid field is reported as a *FieldError (joined into the returned
// error) and the part it belongs to is skipped. A bad port drops that
// ServicePort; a bad external address, source range or nodePort drops only
// that value; a Service with no valid cluster IP has no usable port at all.
func ServicePortsFromService(svc *v1.Service) ([]*ServicePort, error) {
	if svc == nil || ShouldSkipService(svc) {
		return nil, nil
	}
	c := &serviceConverter{svc: svc, name: types.NamespacedName{Namespace: svc.Namespace, Name: svc.Name}}
	if !c.validNames() {
		return nil, errors.Join(c.errs...)
	}
	clusterIPs := c.clusterIPs()
	if len(clusterIPs) == 0 {
		return nil, errors.Join(c.errs...)
	}
	base := ServicePort{
		Type:                     svc.Spec.Type,
		ClusterIPs:               clusterIPs,
		ExternalIPs:              c.addrs("spec.externalIPs", svc.Spec.ExternalIPs),
		LoadBalancerIPs:          c.loadBalancerIPs(),
		LoadBalancerSourceRanges: c.sourceRanges(),
		ExternalPolicyLocal:      externalPolicyLocal(svc),
		InternalPolicyLocal:      internalPolicyLocal(svc),
		AffinityTimeout:          c.affinityTimeout(),
	}
	if base.Type == "" {
		base.Type = v1.ServiceTypeClusterIP
	}
	if svc.Spec.TrafficDistribution != nil {
		base.TrafficDistribution = *svc.Spec.TrafficDistribution
	}
	if svc.Spec.Type == v1.ServiceTypeLoadBalancer && base.ExternalPolicyLocal {
		base.HealthCheckNodePort = c.healthCheckNodePort()
	}

	var out []*ServicePort
	seen := make(map[ServicePortName]int, len(svc.Spec.Ports))
	objNames := make(map[ServicePortName]int, len(svc.Spec.Ports))
	for i, p := range svc.Spec.Ports {
		field := fmt.Sprintf("spec.ports[%d]", i)
		proto, err := parseProtocol(p.Protocol)
		if err != nil {
			c.fail(field+".protocol", err)
			continue
		}
		if p.Name != "" {
			// The API server checks a Service port's name as a DNS-1123
			// label (63 characters); the 15-character IANA service name
			// (IsValidPortName) is the rule for container ports only.
			if msgs := validation.IsDNS1123Label(p.Name); len(msgs) > 0 {
				c.fail(field+".name", fmt.Errorf("%q: %s", p.Name, strings.Join(msgs, "; ")))
				continue
			}
		}
		if err := checkPort(p.Port); err != nil {
			c.fail(field+".port", err)
			continue
		}
		spn := ServicePortName{NamespacedName: c.name, Port: p.Name, Protocol: proto}
		if j, dup := seen[spn]; dup {
			c.fail(field+".name", fmt.Errorf("port name %q with protocol %s already used by spec.ports[%d]", p.Name, proto, j))
			continue
		}
		// Backends name a port's kernel objects by its name, or by its
		// number when it has none, so a port named "80" and an unnamed port
		// 80 of one protocol would share them. The API server never admits
		// both (a Service of several ports must name every one); manifests
		// could, and the second is refused.
		label := p.Name
		if label == "" {
			label = strconv.Itoa(int(p.Port))
		}
		objKey := ServicePortName{NamespacedName: c.name, Port: label, Protocol: proto}
		if j, dup := objNames[objKey]; dup {
			c.fail(field+".name", fmt.Errorf("port %q with protocol %s would share its name with spec.ports[%d] (an unnamed port is named by its number; name every port of a Service with several)", label, proto, j))
			continue
		}
		seen[spn] = i
		objNames[objKey] = i
		sp := base
		sp.Name = spn
		sp.Port = p.Port
		sp.Protocol = proto
		sp.NodePort = c.nodePort(field+".nodePort", p.NodePort)
		out = append(out, &sp)
	}
	return out, errors.Join(c.errs...)
}

// Equal reports whether two ServicePorts program the same forwarding. The
// tracker uses it to drop updates that change nothing a backend sees.
func (sp *ServicePort) Equal(o *ServicePort) bool {
	if sp == nil || o == nil {
		return sp == o
	}
	return sp.Name == o.Name && sp.Type == o.Type && sp.Port == o.Port && sp.Protocol == o.Protocol &&
		sp.NodePort == o.NodePort &&
		slices.Equal(sp.ClusterIPs, o.ClusterIPs) &&
		slices.Equal(sp.ExternalIPs, o.ExternalIPs) &&
		slices.Equal(sp.LoadBalancerIPs, o.LoadBalancerIPs) &&
		slices.Equal(sp.LoadBalancerSourceRanges, o.LoadBalancerSourceRanges) &&
		sp.ExternalPolicyLocal == o.ExternalPolicyLocal && sp.InternalPolicyLocal == o.InternalPolicyLocal &&
		sp.HealthCheckNodePort == o.HealthCheckNodePort && sp.AffinityTimeout == o.AffinityTimeout &&
		sp.TrafficDistribution == o.TrafficDistribution
}

type serviceConverter struct {
	svc  *v1.Service
	name types.NamespacedName
	errs []error
}

func (c *serviceConverter) fail(field string, err error) {
	c.errs = append(c.errs, &FieldError{Kind: "Service", Object: c.name, Field: field, Err: err})
}

// validNames checks the namespace and name the API server would have
// checked: manifests skip the API server, and backends build kernel object
// names from these (nftables chain names are limited to 255 bytes and
// must be unique; "/" or quotes in a name would break both).
//
// Both are DNS-1123 labels. A Service name was a DNS-1035 label (no leading
// digit) until the RelaxedServiceNameValidation gate, on by default since
// Kubernetes 1.36, let it be any DNS-1123 label: kp accepts the wider rule,
// which holds every name either API server version admits.
func (c *serviceConverter) validNames() bool {
	ok := true
	if msgs := validation.IsDNS1123Label(c.name.Namespace); len(msgs) > 0 {
		c.fail("metadata.namespace", fmt.Errorf("%q: %s", c.name.Namespace, strings.Join(msgs, "; ")))
		ok = false
	}
	if msgs := validation.IsDNS1123Label(c.name.Name); len(msgs) > 0 {
		c.fail("metadata.name", fmt.Errorf("%q: %s", c.name.Name, strings.Join(msgs, "; ")))
		ok = false
	}
	return ok
}

// clusterIPs returns the Service's cluster IPs, at most one per family.
// spec.clusterIPs is authoritative; spec.clusterIP is the fallback for
// objects written before dual-stack.
func (c *serviceConverter) clusterIPs() []netip.Addr {
	field, raw := "spec.clusterIPs", c.svc.Spec.ClusterIPs
	if len(raw) == 0 {
		if c.svc.Spec.ClusterIP == "" {
			// The API server always allocates one; only hand-written
			// manifests get here, and no allocator runs for them.
			c.fail("spec.clusterIP", errors.New("no cluster IP set (manifests must set one: nothing allocates it)"))
			return nil
		}
		field, raw = "spec.clusterIP", []string{c.svc.Spec.ClusterIP}
	}
	var out []netip.Addr
	for i, s := range raw {
		f := field
		if field == "spec.clusterIPs" {
			f = fmt.Sprintf("%s[%d]", field, i)
		}
		a, err := parseIP(s)
		if err != nil {
			c.fail(f, err)
			continue
		}
		if slices.ContainsFunc(out, func(b netip.Addr) bool { return b.Is4() == a.Is4() }) {
			c.fail(f, fmt.Errorf("second %s cluster IP %s (at most one per family)", FamilyOf(a), a))
			continue
		}
		out = append(out, a)
	}
	return out
}

func (c *serviceConverter) addrs(field string, raw []string) []netip.Addr {
	var out []netip.Addr
	for i, s := range raw {
		a, err := parseIP(s)
		if err != nil {
			c.fail(fmt.Sprintf("%s[%d]", field, i), err)
			continue
		}
		out = append(out, a)
	}
	return out
}

// loadBalancerIPs returns the ingress IPs a node proxy programs. Ingress
// points in Proxy mode are handled by the load balancer itself (it does not
// deliver packets addressed to the IP), so upstream skips them, and so do we.
func (c *serviceConverter) loadBalancerIPs() []netip.Addr {
	if c.svc.Spec.Type != v1.ServiceTypeLoadBalancer {
		return nil
	}
	var out []netip.Addr
	for i, ing := range c.svc.Status.LoadBalancer.Ingress {
		if ing.IP == "" || (ing.IPMode != nil && *ing.IPMode == v1.LoadBalancerIPModeProxy) {
			continue
		}
		a, err := parseIP(ing.IP)
		if err != nil {
			c.fail(fmt.Sprintf("status.loadBalancer.ingress[%d].ip", i), err)
			continue
		}
		out = append(out, a)
	}
	return out
}

// sourceRanges reads spec.loadBalancerSourceRanges, falling back to the
// older annotation as upstream does.
func (c *serviceConverter) sourceRanges() []netip.Prefix {
	field, raw := "spec.loadBalancerSourceRanges", c.svc.Spec.LoadBalancerSourceRanges
	if len(raw) == 0 {
		ann := strings.TrimSpace(c.svc.Annotations[v1.AnnotationLoadBalancerSourceRangesKey])
		if ann == "" {
			return nil
		}
		field, raw = "metadata.annotations["+v1.AnnotationLoadBalancerSourceRangesKey+"]", strings.Split(ann, ",")
	}
	var out []netip.Prefix
	for i, s := range raw {
		p, err := parsePrefix(strings.TrimSpace(s))
		if err != nil {
			c.fail(fmt.Sprintf("%s[%d]", field, i), err)
			continue
		}
		out = append(out, p)
	}
	return out
}

// maxAffinitySeconds is the API's limit on
// sessionAffinityConfig.clientIP.timeoutSeconds (one day).
const maxAffinitySeconds = 86400

func (c *serviceConverter) affinityTimeout() time.Duration {
	if c.svc.Spec.SessionAffinity != v1.ServiceAffinityClientIP {
		return 0
	}
	def := time.Duration(v1.DefaultClientIPServiceAffinitySeconds) * time.Second
	cfg := c.svc.Spec.SessionAffinityConfig
	if cfg == nil || cfg.ClientIP == nil || cfg.ClientIP.TimeoutSeconds == nil {
		return def
	}
	t := *cfg.ClientIP.TimeoutSeconds
	if t <= 0 || t > maxAffinitySeconds {
		c.fail("spec.sessionAffinityConfig.clientIP.timeoutSeconds",
			fmt.Errorf("%d is outside 1..%d; using the default %d", t, maxAffinitySeconds, v1.DefaultClientIPServiceAffinitySeconds))
		return def
	}
	return time.Duration(t) * time.Second
}

func (c *serviceConverter) healthCheckNodePort() int32 {
	p := c.svc.Spec.HealthCheckNodePort
	if p == 0 {
		c.fail("spec.healthCheckNodePort", errors.New("not set for a LoadBalancer with externalTrafficPolicy Local"))
		return 0
	}
	if err := checkPort(p); err != nil {
		c.fail("spec.healthCheckNodePort", err)
		return 0
	}
	return p
}

// nodePort validates one port's nodePort. A bad value costs only the
// NodePort: the ClusterIP of the same port keeps working.
func (c *serviceConverter) nodePort(field string, p int32) int32 {
	switch c.svc.Spec.Type {
	case v1.ServiceTypeNodePort, v1.ServiceTypeLoadBalancer:
	default:
		if p != 0 {
			c.fail(field, fmt.Errorf("set on a Service of type %s; ignored", c.svc.Spec.Type))
		}
		return 0
	}
	if p == 0 {
		if c.svc.Spec.Type == v1.ServiceTypeNodePort {
			c.fail(field, errors.New("not set for a Service of type NodePort (manifests must set one: nothing allocates it)"))
		}
		return 0
	}
	if err := checkPort(p); err != nil {
		c.fail(field, err)
		return 0
	}
	return p
}

func externalPolicyLocal(svc *v1.Service) bool {
	if svc.Spec.Type != v1.ServiceTypeLoadBalancer && svc.Spec.Type != v1.ServiceTypeNodePort &&
		len(svc.Spec.ExternalIPs) == 0 {
		return false
	}
	return svc.Spec.ExternalTrafficPolicy == v1.ServiceExternalTrafficPolicyLocal
}

func internalPolicyLocal(svc *v1.Service) bool {
	p := svc.Spec.InternalTrafficPolicy
	return p != nil && *p == v1.ServiceInternalTrafficPolicyLocal
}

// parseProtocol defaults an empty protocol to TCP, as the API server does,
// so hand-written manifests may omit it.
func parseProtocol(p v1.Protocol) (v1.Protocol, error) {
	switch p {
	case "":
		return v1.ProtocolTCP, nil
	case v1.ProtocolTCP, v1.ProtocolUDP, v1.ProtocolSCTP:
		return p, nil
	}
	return "", fmt.Errorf("unsupported protocol %q (want TCP, UDP or SCTP)", p)
}

func checkPort(p int32) error {
	if p < 1 || p > 65535 {
		return fmt.Errorf("port %d is outside 1..65535", p)
	}
	return nil
}
