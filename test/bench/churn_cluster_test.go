package bench

import (
	"context"
	"fmt"
	"net/netip"
	"slices"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The churn phases' writes to the API server (churn_test.go drives them).

// churnBase is where churned endpoints live: 11.0.0.0/8, outside every
// range of the run (worlds 10/8, Services 100.64/12, fake endpoints
// 172.16/12, incremental changes 198.18/15), so each address names one
// change of the whole run; 11.255.255.255 is the watch's probe.
var churnBase = netip.MustParseAddr("11.0.0.0")

// churnProbe is an address only the watch's probe transaction writes.
var churnProbe = netip.MustParseAddr("11.255.255.255")

// churnTarget is the Service the k-th churn change edits: a stride prime
// to n walks every Service before it comes back to one (so two writes to
// one slice are n/rate seconds apart), skipping the samples and Service 0.
func churnTarget(k, n int) int { return spreadTarget(k, n, 7) }

// nextChurnAddr draws the next address of churnBase.
func (c *cluster) nextChurnAddr() netip.Addr {
	k := c.churnAddrs.Add(1)
	if k >= 1<<24-1 {
		c.t.Fatalf("churn: out of addresses in %s/8", churnBase)
	}
	b := churnBase.As4()
	return netip.AddrFrom4([4]byte{b[0], byte(k >> 16), byte(k >> 8), byte(k)})
}

// rollOne replaces the next endpoint of Service i in turn with addr, as a
// rolling update replaces pods one by one, and returns the slice's new
// addresses.
func (c *cluster) rollOne(i int, addr netip.Addr) []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	cur := c.current(i)
	j := c.rolled[i] % endpointsPer
	c.rolled[i]++
	cur[j] = addr.String()
	c.endpoints[i] = cur
	return slices.Clone(cur)
}

// current is Service i's endpoints as the run last wrote them (c.mu held).
func (c *cluster) current(i int) []string {
	if c.endpoints == nil {
		c.endpoints, c.rolled = map[int][]string{}, map[int]int{}
	}
	if cur, ok := c.endpoints[i]; ok {
		return cur
	}
	cur := make([]string, endpointsPer)
	for j := range cur {
		cur[j] = fakeEndpoint(i, j)
	}
	return cur
}

// writeSlice replaces Service i's EndpointSlice with addrs in one write,
// without reading it first (EndpointSlices take unconditional updates).
func (c *cluster) writeSlice(ctx context.Context, i int, addrs []string) error {
	if _, err := c.api.DiscoveryV1().EndpointSlices(namespace).Update(ctx, slice(i, addrs), metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("update EndpointSlice %s/%s: %w", namespace, serviceName(i), err)
	}
	return nil
}

// churnService is the name of the k-th Service the churn phases create.
func churnService(k int64) string { return fmt.Sprintf("churn-%07d", k) }

// createService creates a Service named name and its EndpointSlice with
// endpoints addrs.
func (c *cluster) createService(ctx context.Context, name string, addrs []string) error {
	svc := &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace},
		Spec:       v1.ServiceSpec{Ports: []v1.ServicePort{{Name: "http", Protocol: v1.ProtocolTCP, Port: servicePort}}},
	}
	if _, err := c.api.CoreV1().Services(namespace).Create(ctx, svc, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create Service %s/%s: %w", namespace, name, err)
	}
	sl := slice(0, addrs)
	sl.Name, sl.Labels = name, map[string]string{discovery.LabelServiceName: name}
	if _, err := c.api.DiscoveryV1().EndpointSlices(namespace).Create(ctx, sl, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create EndpointSlice %s/%s: %w", namespace, name, err)
	}
	return nil
}

// deleteService deletes Service name and its EndpointSlice.
func (c *cluster) deleteService(ctx context.Context, name string) error {
	if err := c.api.CoreV1().Services(namespace).Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
		return fmt.Errorf("delete Service %s/%s: %w", namespace, name, err)
	}
	if err := c.api.DiscoveryV1().EndpointSlices(namespace).Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
		return fmt.Errorf("delete EndpointSlice %s/%s: %w", namespace, name, err)
	}
	return nil
}
