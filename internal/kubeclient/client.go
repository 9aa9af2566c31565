// Package kubeclient is kp's Kubernetes API client: typed clients for the
// few resources kp reads and writes (Services, EndpointSlices, Nodes,
// ServiceCIDRs, Events, Pods, DaemonSets, ConfigMaps), over client-go's REST client,
// with a scheme of only their API groups.
//
// client-go's generated clientset would do, but linking it registers every
// API group of Kubernetes at start (its scheme, every typed client, every
// apply configuration): 8 MiB of resident memory in every kp process,
// measured (test/bench/NOTES.md, "Memory"), for the eight kinds kp uses.
// The interfaces here have client-go's typed-client method sets, so a
// client-go clientset (a fake, in unit tests) fits them through
// kubeclient/fromclientset.
package kubeclient

import (
	"context"
	"fmt"
	"net/http"

	appsv1 "k8s.io/api/apps/v1"
	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/flowcontrol"
)

// Interface is the part of the Kubernetes API kp calls, grouped as
// client-go's clientset groups it.
type Interface interface {
	CoreV1() CoreV1Interface
	DiscoveryV1() DiscoveryV1Interface
	NetworkingV1() NetworkingV1Interface
	AppsV1() AppsV1Interface
	Discovery() DiscoveryInterface
}

type CoreV1Interface interface {
	Services(namespace string) ServiceInterface
	Nodes() NodeInterface
	Events(namespace string) EventInterface
	Pods(namespace string) PodInterface
	ConfigMaps(namespace string) ConfigMapInterface
}

type DiscoveryV1Interface interface {
	EndpointSlices(namespace string) EndpointSliceInterface
}

type NetworkingV1Interface interface {
	ServiceCIDRs() ServiceCIDRInterface
}

type AppsV1Interface interface {
	DaemonSets(namespace string) DaemonSetInterface
}

// DiscoveryInterface asks whether the API server answers, and what it
// serves.
type DiscoveryInterface interface {
	ServerVersion(ctx context.Context) error
	ServerResourcesForGroupVersion(ctx context.Context, groupVersion string) (*metav1.APIResourceList, error)
}

// ListWatcher is what a reflector needs of a kind.
type ListWatcher[L runtime.Object] interface {
	List(ctx context.Context, opts metav1.ListOptions) (L, error)
	Watch(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error)
}

type ServiceInterface = ListWatcher[*v1.ServiceList]

type EndpointSliceInterface = ListWatcher[*discoveryv1.EndpointSliceList]

type ServiceCIDRInterface = ListWatcher[*networkingv1.ServiceCIDRList]

type NodeInterface interface {
	ListWatcher[*v1.NodeList]
	Get(ctx context.Context, name string, opts metav1.GetOptions) (*v1.Node, error)
	Patch(ctx context.Context, name string, pt types.PatchType, data []byte, opts metav1.PatchOptions, subresources ...string) (*v1.Node, error)
}

type EventInterface interface {
	Create(ctx context.Context, event *v1.Event, opts metav1.CreateOptions) (*v1.Event, error)
}

type PodInterface interface {
	List(ctx context.Context, opts metav1.ListOptions) (*v1.PodList, error)
}

// ConfigMapInterface reads ConfigMaps: kube-proxy's configuration, for kp
// migrate cluster --from-kube-proxy.
type ConfigMapInterface interface {
	Get(ctx context.Context, name string, opts metav1.GetOptions) (*v1.ConfigMap, error)
}

type DaemonSetInterface interface {
	Get(ctx context.Context, name string, opts metav1.GetOptions) (*appsv1.DaemonSet, error)
	Update(ctx context.Context, ds *appsv1.DaemonSet, opts metav1.UpdateOptions) (*appsv1.DaemonSet, error)
	Delete(ctx context.Context, name string, opts metav1.DeleteOptions) error
}

// scheme holds the API groups above and nothing else; parameterCodec
// encodes list, get and write options as query parameters.
var (
	scheme         = newScheme()
	codecs         = serializer.NewCodecFactory(scheme)
	parameterCodec = runtime.NewParameterCodec(scheme)
)

func newScheme() *runtime.Scheme {
	s := runtime.NewScheme()
	metav1.AddToGroupVersion(s, schema.GroupVersion{Version: "v1"})
	for _, add := range []func(*runtime.Scheme) error{v1.AddToScheme, discoveryv1.AddToScheme, networkingv1.AddToScheme, appsv1.AddToScheme} {
		if err := add(s); err != nil {
			panic(err) // generated registrations of fixed types
		}
	}
	return s
}

// Client talks to one API server: a REST client per API group, sharing one
// HTTP client (one connection pool) and one rate limiter, as client-go's
// clientset does.
type Client struct {
	cfg                               *rest.Config
	core, discovery, networking, apps *rest.RESTClient
	// root has no group prefix, for /version and discovery documents.
	root *rest.RESTClient
}

var _ Interface = (*Client)(nil)

// New returns a client for cfg (rest.Config as clientcmd or
// rest.InClusterConfig build it). QPS and Burst make one token bucket for
// every group, unless cfg has a RateLimiter of its own.
func New(cfg *rest.Config) (*Client, error) {
	c := *cfg
	if c.UserAgent == "" {
		c.UserAgent = rest.DefaultKubernetesUserAgent()
	}
	if c.RateLimiter == nil && c.QPS > 0 {
		if c.Burst <= 0 {
			return nil, fmt.Errorf("API client: burst must be greater than 0 when QPS is set (QPS %v)", c.QPS)
		}
		c.RateLimiter = flowcontrol.NewTokenBucketRateLimiter(c.QPS, c.Burst)
	}
	httpClient, err := rest.HTTPClientFor(&c)
	if err != nil {
		return nil, fmt.Errorf("API client for %s: %w", c.Host, err)
	}
	k := Client{cfg: rest.CopyConfig(&c)}
	for _, g := range []struct {
		into    **rest.RESTClient
		gv      schema.GroupVersion
		apiPath string
	}{
		{&k.core, v1.SchemeGroupVersion, "/api"},
		{&k.discovery, discoveryv1.SchemeGroupVersion, "/apis"},
		{&k.networking, networkingv1.SchemeGroupVersion, "/apis"},
		{&k.apps, appsv1.SchemeGroupVersion, "/apis"},
		{&k.root, schema.GroupVersion{}, ""},
	} {
		if *g.into, err = restClient(c, httpClient, g.gv, g.apiPath); err != nil {
			return nil, fmt.Errorf("API client for %s, group %q: %w", c.Host, g.gv, err)
		}
	}
	return &k, nil
}

func restClient(c rest.Config, httpClient *http.Client, gv schema.GroupVersion, apiPath string) (*rest.RESTClient, error) {
	c.GroupVersion = &gv
	c.APIPath = apiPath
	c.NegotiatedSerializer = codecs.WithoutConversion()
	if gv.Empty() {
		return rest.UnversionedRESTClientForConfigAndClient(&c, httpClient)
	}
	return rest.RESTClientForConfigAndClient(&c, httpClient)
}

// RESTConfig returns a copy of the client's configuration, for what the
// REST clients do not do: kp migrate cluster's pods/exec streams.
func (c *Client) RESTConfig() *rest.Config { return rest.CopyConfig(c.cfg) }

func (c *Client) CoreV1() CoreV1Interface             { return coreV1{c.core} }
func (c *Client) DiscoveryV1() DiscoveryV1Interface   { return discoveryV1{c.discovery} }
func (c *Client) NetworkingV1() NetworkingV1Interface { return networkingV1{c.networking} }
func (c *Client) AppsV1() AppsV1Interface             { return appsV1{c.apps} }
func (c *Client) Discovery() DiscoveryInterface       { return discovery{c.root} }

type coreV1 struct{ rc rest.Interface }

func (g coreV1) Services(namespace string) ServiceInterface {
	return resource[*v1.Service, *v1.ServiceList]{g.rc, "services", namespace}
}

func (g coreV1) Nodes() NodeInterface {
	return resource[*v1.Node, *v1.NodeList]{g.rc, "nodes", ""}
}

func (g coreV1) Events(namespace string) EventInterface {
	return resource[*v1.Event, *v1.EventList]{g.rc, "events", namespace}
}

func (g coreV1) Pods(namespace string) PodInterface {
	return pods{resource[*v1.Pod, *v1.PodList]{g.rc, "pods", namespace}}
}

func (g coreV1) ConfigMaps(namespace string) ConfigMapInterface {
	return resource[*v1.ConfigMap, *v1.ConfigMapList]{g.rc, "configmaps", namespace}
}

type discoveryV1 struct{ rc rest.Interface }

func (g discoveryV1) EndpointSlices(namespace string) EndpointSliceInterface {
	return resource[*discoveryv1.EndpointSlice, *discoveryv1.EndpointSliceList]{g.rc, "endpointslices", namespace}
}

type networkingV1 struct{ rc rest.Interface }

func (g networkingV1) ServiceCIDRs() ServiceCIDRInterface {
	return resource[*networkingv1.ServiceCIDR, *networkingv1.ServiceCIDRList]{g.rc, "servicecidrs", ""}
}

type appsV1 struct{ rc rest.Interface }

func (g appsV1) DaemonSets(namespace string) DaemonSetInterface {
	return resource[*appsv1.DaemonSet, *appsv1.DaemonSetList]{g.rc, "daemonsets", namespace}
}

type pods struct {
	resource[*v1.Pod, *v1.PodList]
}
