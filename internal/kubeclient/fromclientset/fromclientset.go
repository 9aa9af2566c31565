// Package fromclientset fits a client-go clientset to kubeclient.Interface,
// for tests that drive kp's sources through client-go's fake clientset (its
// object tracker and reactors). Only tests import it: the kp binary links
// no clientset (package kubeclient says why).
package fromclientset

import (
	"context"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	appsv1client "k8s.io/client-go/kubernetes/typed/apps/v1"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	discoveryv1client "k8s.io/client-go/kubernetes/typed/discovery/v1"
	networkingv1client "k8s.io/client-go/kubernetes/typed/networking/v1"
	"k8s.io/client-go/util/watchlist"

	"github.com/kpproxy/kp/internal/kubeclient"
)

// New returns c as a kubeclient.Interface.
func New(c kubernetes.Interface) kubeclient.Interface { return clientset{c} }

type clientset struct{ c kubernetes.Interface }

// IsWatchListSemanticsUnSupported passes on a fake's answer: its watches
// cannot stream an initial list, so client-go's reflectors list instead.
func (s clientset) IsWatchListSemanticsUnSupported() bool {
	return watchlist.DoesClientNotSupportWatchListSemantics(s.c)
}

func (s clientset) CoreV1() kubeclient.CoreV1Interface { return coreV1{s.c.CoreV1()} }
func (s clientset) DiscoveryV1() kubeclient.DiscoveryV1Interface {
	return discoveryV1{s.c.DiscoveryV1()}
}
func (s clientset) NetworkingV1() kubeclient.NetworkingV1Interface {
	return networkingV1{s.c.NetworkingV1()}
}
func (s clientset) AppsV1() kubeclient.AppsV1Interface       { return appsV1{s.c.AppsV1()} }
func (s clientset) Discovery() kubeclient.DiscoveryInterface { return discovery{s.c} }

type coreV1 struct{ c corev1client.CoreV1Interface }

func (g coreV1) Services(ns string) kubeclient.ServiceInterface { return g.c.Services(ns) }
func (g coreV1) Nodes() kubeclient.NodeInterface                { return g.c.Nodes() }
func (g coreV1) Events(ns string) kubeclient.EventInterface     { return g.c.Events(ns) }
func (g coreV1) Pods(ns string) kubeclient.PodInterface         { return g.c.Pods(ns) }
func (g coreV1) ConfigMaps(ns string) kubeclient.ConfigMapInterface {
	return g.c.ConfigMaps(ns)
}

type discoveryV1 struct {
	c discoveryv1client.DiscoveryV1Interface
}

func (g discoveryV1) EndpointSlices(ns string) kubeclient.EndpointSliceInterface {
	return g.c.EndpointSlices(ns)
}

type networkingV1 struct {
	c networkingv1client.NetworkingV1Interface
}

func (g networkingV1) ServiceCIDRs() kubeclient.ServiceCIDRInterface { return g.c.ServiceCIDRs() }

type appsV1 struct{ c appsv1client.AppsV1Interface }

func (g appsV1) DaemonSets(ns string) kubeclient.DaemonSetInterface { return g.c.DaemonSets(ns) }

// discovery answers from the clientset's discovery client, which a fake
// answers from memory (so the context has nothing to bound).
type discovery struct{ c kubernetes.Interface }

func (d discovery) ServerVersion(context.Context) error {
	_, err := d.c.Discovery().ServerVersion()
	return err
}

func (d discovery) ServerResourcesForGroupVersion(_ context.Context, gv string) (*metav1.APIResourceList, error) {
	return d.c.Discovery().ServerResourcesForGroupVersion(gv)
}
