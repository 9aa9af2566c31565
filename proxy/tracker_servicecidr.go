package proxy

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/types"
)

// serviceCIDRState is the tracker's view of the cluster's Service CIDRs:
// the ServiceCIDR objects (networking.k8s.io/v1) by name, plus the static
// ones kp was given (--service-cidrs). It is guarded by the tracker's mutex.
type serviceCIDRState struct {
	static  []netip.Prefix
	byName  map[string][]netip.Prefix
	logKeys map[string]string
}

// OnServiceCIDR records a ServiceCIDR object's new version (nil: deleted).
// Every CIDR of spec.cidrs counts, also while the object is being deleted:
// upstream kube-proxy does the same (the allocator stops allocating from a
// deleting ServiceCIDR, but addresses already allocated in it stay in use
// until the object is gone, and unallocated ones may still be dropped).
func (t *ChangeTracker) OnServiceCIDR(name string, cidr *networkingv1.ServiceCIDR) {
	var prefixes []netip.Prefix
	var errs []error
	if cidr != nil {
		prefixes, errs = parseServiceCIDR(cidr)
	}
	t.mu.Lock()
	sc := &t.serviceCIDRs
	before := sc.merged()
	if sc.byName == nil {
		sc.byName = make(map[string][]netip.Prefix)
		sc.logKeys = make(map[string]string)
	}
	if cidr == nil {
		delete(sc.byName, name)
		delete(sc.logKeys, name)
	} else {
		sc.byName[name] = prefixes
		sc.logKeys[name] = t.logOnce(sc.logKeys[name], cidr.ResourceVersion, errs)
	}
	changed := !slices.Equal(before, sc.merged())
	t.mu.Unlock()
	if changed {
		t.onChange()
	}
}

// parseServiceCIDR validates spec.cidrs; a bad entry is skipped alone.
func parseServiceCIDR(cidr *networkingv1.ServiceCIDR) ([]netip.Prefix, []error) {
	var out []netip.Prefix
	var errs []error
	for i, s := range cidr.Spec.CIDRs {
		p, err := netip.ParsePrefix(strings.TrimSpace(s))
		if err == nil && p.Addr().Zone() != "" {
			err = fmt.Errorf("zones are not allowed")
		}
		if err != nil {
			errs = append(errs, &FieldError{Kind: "ServiceCIDR", Object: types.NamespacedName{Name: cidr.Name},
				Field: fmt.Sprintf("spec.cidrs[%d]", i), Err: fmt.Errorf("invalid CIDR %q: %w", s, err)})
			continue
		}
		out = append(out, p.Masked())
	}
	return out, errs
}

// merged returns every known CIDR, sorted (IPv4 first) and deduplicated.
func (sc *serviceCIDRState) merged() []netip.Prefix {
	out := slices.Clone(sc.static)
	for _, ps := range sc.byName {
		out = append(out, ps...)
	}
	slices.SortFunc(out, comparePrefixes)
	return slices.Compact(out)
}

func comparePrefixes(a, b netip.Prefix) int {
	if c := a.Addr().Compare(b.Addr()); c != 0 {
		return c
	}
	return a.Bits() - b.Bits()
}

// snapshotServiceCIDRs fills the State's Service CIDRs. Called with the
// tracker's mutex held.
func (t *ChangeTracker) snapshotServiceCIDRs(s *State) {
	s.ServiceCIDRs = t.serviceCIDRs.merged()
	s.ServiceCIDRsChanged = !slices.Equal(s.ServiceCIDRs, t.prevServiceCIDRs)
	t.prevServiceCIDRs = s.ServiceCIDRs
}
