package e2e

import (
	"bufio"
	"bytes"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes/scheme"
)

// decodeAll decodes a multi-document manifest strictly, as the API server would.
func decodeAll(t *testing.T, y []byte) []runtime.Object {
	t.Helper()
	dec := serializer.NewCodecFactory(scheme.Scheme, serializer.EnableStrict).UniversalDeserializer()
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(y)))
	var objs []runtime.Object
	for {
		doc, err := r.Read()
		if err != nil {
			break
		}
		if len(bytes.TrimSpace(doc)) == 0 {
			continue
		}
		o, _, err := dec.Decode(doc, nil, nil)
		if err != nil {
			t.Fatalf("decode %q: %v", doc, err)
		}
		objs = append(objs, o)
	}
	return objs
}

func TestManifestsDecodeAsAPIObjects(t *testing.T) {
	y, err := YAML(
		Node("node", []string{"10.100.2.1", "fd00:100:2::1"}, []string{"10.100.1.0/24"}),
		Service{
			Name:       "web",
			Type:       v1.ServiceTypeNodePort,
			ClusterIPs: []string{"10.96.0.10", "fd00:96::10"},
			Ports: []Port{
				{Name: "http", Port: 80, TargetPort: 8080, NodePort: 30080},
				{Name: "dns", Protocol: v1.ProtocolUDP, Port: 53, TargetPortName: "dns", NodePort: 30053},
			},
			Endpoints: []Endpoint{
				{IP: "10.100.1.10", NodeName: "node", Ports: map[string]int32{"dns": 5353}},
				{IP: "10.100.1.11", Ports: map[string]int32{"dns": 5353}},
				Terminating("10.100.1.12"),
				NotReady("fd00:100:1::10"),
			},
		},
		Service{Name: "empty", ClusterIPs: []string{"10.96.0.11"}, Ports: []Port{{Name: "http", Port: 80, TargetPort: 8080}}},
		Service{Name: "unpublished", ClusterIPs: []string{"10.96.0.12"}, Ports: []Port{{Port: 80, TargetPort: 8080}}, NoSlices: true},
	)
	if err != nil {
		t.Fatal(err)
	}
	objs := decodeAll(t, y)
	var kinds []string
	for _, o := range objs {
		kinds = append(kinds, o.GetObjectKind().GroupVersionKind().Kind)
	}
	// node; web with 3 slices (IPv4 and IPv6 in the Service's order, then
	// IPv4 endpoints numbering dns 5353); empty with its empty slice;
	// unpublished alone.
	want := "Node Service EndpointSlice EndpointSlice EndpointSlice Service EndpointSlice Service"
	if got := strings.Join(kinds, " "); got != want {
		t.Fatalf("kinds:\n got %s\nwant %s\n%s", got, want, y)
	}
	svc := objs[1].(*v1.Service)
	if svc.Namespace != "e2e" || svc.Spec.ClusterIP != "10.96.0.10" || len(svc.Spec.IPFamilies) != 2 ||
		*svc.Spec.IPFamilyPolicy != v1.IPFamilyPolicyRequireDualStack || svc.Spec.Ports[1].TargetPort.StrVal != "dns" {
		t.Errorf("service spec: %+v", svc.Spec)
	}
	term := objs[2].(*discovery.EndpointSlice)
	if term.AddressType != discovery.AddressTypeIPv4 || len(term.Endpoints) != 1 || *term.Ports[1].Port != 0 {
		t.Errorf("IPv4 slice: %+v", term)
	} else if c := term.Endpoints[0].Conditions; *c.Ready || !*c.Serving || !*c.Terminating {
		t.Errorf("terminating endpoint: %+v", c)
	}
	v6 := objs[3].(*discovery.EndpointSlice)
	if v6.AddressType != discovery.AddressTypeIPv6 || len(v6.Endpoints) != 1 || *v6.Endpoints[0].Conditions.Ready {
		t.Errorf("IPv6 slice: %+v", v6)
	}
	dns := objs[4].(*discovery.EndpointSlice)
	if dns.Labels[discovery.LabelServiceName] != "web" || dns.AddressType != discovery.AddressTypeIPv4 ||
		len(dns.Endpoints) != 2 || *dns.Ports[1].Port != 5353 || *dns.Endpoints[0].NodeName != "node" {
		t.Errorf("slice numbering dns 5353: %+v", dns)
	}
	if empty := objs[6].(*discovery.EndpointSlice); len(empty.Endpoints) != 0 {
		t.Errorf("empty slice: %+v", empty)
	}
}
