package proxy

import (
	"fmt"
	"maps"
	"net/netip"
	"slices"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
)

// nodeFrom converts the proxy's own Node. IPs lists the InternalIP addresses
// first, then the ExternalIP ones, in status order; the first address of a
// family is that family's primary node IP, as upstream's GetNodeHostIPs picks
// it. A nil node (not known yet, or deleted) yields just the name.
func NodeFrom(name string, node *v1.Node) (Node, []error) {
	if node == nil {
		return Node{Name: name}, nil
	}
	n := Node{Name: node.Name, Labels: maps.Clone(node.Labels), ProxyMode: node.Annotations[AnnotationProxyMode]}
	var errs []error
	n.PodCIDRs, errs = podCIDRs(node)
	for _, typ := range []v1.NodeAddressType{v1.NodeInternalIP, v1.NodeExternalIP} {
		for i, addr := range node.Status.Addresses {
			if addr.Type != typ {
				continue
			}
			a, err := parseIP(addr.Address)
			if err != nil {
				errs = append(errs, &FieldError{Kind: "Node", Object: types.NamespacedName{Name: node.Name},
					Field: fmt.Sprintf("status.addresses[%d].address", i), Err: err})
				continue
			}
			if !slices.Contains(n.IPs, a) {
				n.IPs = append(n.IPs, a)
			}
		}
	}
	return n, errs
}

// podCIDRs reads spec.podCIDRs, or the older spec.podCIDR alone.
func podCIDRs(node *v1.Node) ([]netip.Prefix, []error) {
	field, cidrs := "spec.podCIDRs", node.Spec.PodCIDRs
	if len(cidrs) == 0 && node.Spec.PodCIDR != "" {
		field, cidrs = "spec.podCIDR", []string{node.Spec.PodCIDR}
	}
	var out []netip.Prefix
	var errs []error
	for i, c := range cidrs {
		p, err := netip.ParsePrefix(c)
		if err != nil {
			errs = append(errs, &FieldError{Kind: "Node", Object: types.NamespacedName{Name: node.Name},
				Field: fmt.Sprintf("%s[%d]", field, i), Err: err})
			continue
		}
		out = append(out, p.Masked())
	}
	return out, errs
}

// Equal reports whether two Nodes carry the same name, addresses, labels,
// requested proxy mode and pod CIDRs.
func (n Node) Equal(o Node) bool {
	return n.sameForServices(o) && n.ProxyMode == o.ProxyMode && slices.Equal(n.PodCIDRs, o.PodCIDRs)
}

// sameForServices reports whether two Nodes program Services the same:
// name, addresses and labels.
func (n Node) sameForServices(o Node) bool {
	return n.Name == o.Name && slices.Equal(n.IPs, o.IPs) && maps.Equal(n.Labels, o.Labels)
}

// PrimaryIP returns the node's first address of family f, if any.
func (n Node) PrimaryIP(f Family) (netip.Addr, bool) {
	for _, a := range n.IPs {
		if f.Has(a) {
			return a, true
		}
	}
	return netip.Addr{}, false
}
