package bench

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	networking "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer/protobuf"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/uuid"
	"k8s.io/client-go/kubernetes/scheme"

	"github.com/kpproxy/kp/test/netns"
)

// Populating through the API server is quadratic at this release: after
// each ClusterIP it allocates, kube-apiserver's allocator recounts its
// addresses for a metric by listing every IPAddress object, twice
// (pkg/registry/core/service/ipallocator, Allocator.Used). Measured here:
// 54 Services/s up to 10,000, 25/s from 10,000 to 20,000, 12/s beyond, so
// 100,000 would have taken hours. grow therefore writes what the API server
// would have written straight into its etcd, in the storage encoding
// (protobuf), through etcd's JSON gateway: the Service with its ClusterIP,
// the IPAddress that records the allocation, and the Service's
// EndpointSlice. The API server's watch cache takes them in from etcd's
// watch like any other write, and everything after (the proxies' lists and
// watches, the benchmark's endpoint changes) goes through the API server.

// Where kube-apiserver keeps each kind under its default --etcd-prefix.
const (
	etcdServices       = "/registry/services/specs/"
	etcdEndpointSlices = "/registry/endpointslices/"
	etcdIPAddresses    = "/registry/ipaddresses/"
	etcdClientURL      = "http://127.0.0.1:2379" // in the API server's namespace
	// etcdTxnOps is etcd's default --max-txn-ops; each Service is three.
	etcdTxnOps  = 128
	fillWorkers = 4
)

// storageCodec encodes objects as kube-apiserver stores them.
var storageCodec = protobuf.NewSerializer(scheme.Scheme, scheme.Scheme)

// fillClusterIP is Service i's ClusterIP: serviceRange's 17th address
// onwards, clear of the first, which the kubernetes Service takes.
func fillClusterIP(i int) netip.Addr {
	b := serviceRange.Addr().As4()
	v := binary.BigEndian.Uint32(b[:]) + 16 + uint32(i)
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
}

// fillObjects are Service i's objects as the API server would store them
// after creating the Service and its slice: etcd key → storage encoding.
func fillObjects(i int, now metav1.Time) (map[string][]byte, error) {
	name, ip := serviceName(i), fillClusterIP(i)
	svc := &v1.Service{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Service"},
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace, UID: uuid.NewUUID(), CreationTimestamp: now},
		Spec: v1.ServiceSpec{
			Type: v1.ServiceTypeClusterIP, ClusterIP: ip.String(), ClusterIPs: []string{ip.String()},
			IPFamilies: []v1.IPFamily{v1.IPv4Protocol}, IPFamilyPolicy: ptr(v1.IPFamilyPolicySingleStack),
			SessionAffinity: v1.ServiceAffinityNone, InternalTrafficPolicy: ptr(v1.ServiceInternalTrafficPolicyCluster),
			Ports: []v1.ServicePort{{Name: "http", Protocol: v1.ProtocolTCP, Port: servicePort, TargetPort: intstr.FromInt32(servicePort)}},
		},
	}
	addr := &networking.IPAddress{
		TypeMeta: metav1.TypeMeta{APIVersion: "networking.k8s.io/v1", Kind: "IPAddress"},
		ObjectMeta: metav1.ObjectMeta{Name: ip.String(), UID: uuid.NewUUID(), CreationTimestamp: now,
			Labels: map[string]string{
				networking.LabelIPAddressFamily: string(v1.IPv4Protocol),
				networking.LabelManagedBy:       "ipallocator.k8s.io",
			}},
		Spec: networking.IPAddressSpec{ParentRef: &networking.ParentReference{Resource: "services", Namespace: namespace, Name: name}},
	}
	addrs := make([]string, endpointsPer)
	for j := range addrs {
		addrs[j] = fakeEndpoint(i, j)
	}
	sl := slice(i, addrs)
	sl.TypeMeta = metav1.TypeMeta{APIVersion: "discovery.k8s.io/v1", Kind: "EndpointSlice"}
	sl.UID, sl.CreationTimestamp, sl.Generation = uuid.NewUUID(), now, 1

	out := map[string][]byte{}
	for key, obj := range map[string]runtime.Object{
		etcdServices + namespace + "/" + name:       svc,
		etcdIPAddresses + ip.String():               addr,
		etcdEndpointSlices + namespace + "/" + name: sl,
	} {
		var b bytes.Buffer
		if err := storageCodec.Encode(obj, &b); err != nil {
			return nil, fmt.Errorf("encode %s: %w", key, err)
		}
		out[key] = b.Bytes()
	}
	return out, nil
}

// fill writes Services from to n-1 into the API server's etcd, waits until
// the API server serves them, and records their ClusterIPs.
func (c *cluster) fill(from, n int) error {
	client := &http.Client{Timeout: time.Minute, Transport: &http.Transport{
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			return netns.DialConn(ctx, c.srv.NS(), network, addr)
		}}}
	per := etcdTxnOps / 3
	chunks := make(chan int)
	errs := make(chan error, fillWorkers)
	var wg sync.WaitGroup
	for w := 0; w < fillWorkers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for start := range chunks {
				if err := c.fillChunk(client, start, min(start+per, n)); err != nil {
					errs <- err
					for range chunks {
					}
					return
				}
			}
		}()
	}
	for start := from; start < n; start += per {
		chunks <- start
	}
	close(chunks)
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return err
	}
	c.mu.Lock()
	for i := from; i < n; i++ {
		c.clusterIPs[i] = fillClusterIP(i).String()
	}
	c.mu.Unlock()
	return c.waitServed(n)
}

// etcdTxn is the JSON gateway's transaction: puts only, no compare.
type etcdTxn struct {
	Success []etcdOp `json:"success"`
}

type etcdOp struct {
	RequestPut etcdPut `json:"requestPut"`
}

type etcdPut struct {
	Key   []byte `json:"key"` // base64, as the gateway wants
	Value []byte `json:"value"`
}

// fillChunk writes Services from to to-1 in one etcd transaction.
func (c *cluster) fillChunk(client *http.Client, from, to int) error {
	now := metav1.NewTime(time.Now().UTC().Truncate(time.Second))
	var txn etcdTxn
	for i := from; i < to; i++ {
		objs, err := fillObjects(i, now)
		if err != nil {
			return err
		}
		for k, v := range objs {
			txn.Success = append(txn.Success, etcdOp{etcdPut{Key: []byte(k), Value: v}})
		}
	}
	body, err := json.Marshal(txn)
	if err != nil {
		return err
	}
	resp, err := client.Post(etcdClientURL+"/v3/kv/txn", "application/json", bytes.NewReader(body))
	if err != nil {
		return fmt.Errorf("write Services %s to %s into etcd: %w", serviceName(from), serviceName(to-1), err)
	}
	defer resp.Body.Close()
	out, _ := io.ReadAll(resp.Body)
	var res struct {
		Succeeded bool   `json:"succeeded"`
		Error     string `json:"error"`
	}
	if err := json.Unmarshal(out, &res); resp.StatusCode != http.StatusOK || err != nil || !res.Succeeded {
		return fmt.Errorf("write Services %s to %s into etcd: HTTP %d: %s", serviceName(from), serviceName(to-1), resp.StatusCode, out)
	}
	return nil
}

// waitServed waits until the API server lists at least n Services and n
// EndpointSlices in the namespace (its watch cache has caught up with
// etcd).
func (c *cluster) waitServed(n int) error {
	deadline := time.Now().Add(5 * time.Minute)
	for {
		svcs, err := c.api.CoreV1().Services(namespace).List(ctx(c.t), metav1.ListOptions{Limit: 1})
		if err != nil {
			return fmt.Errorf("list Services: %w", err)
		}
		sls, err := c.api.DiscoveryV1().EndpointSlices(namespace).List(ctx(c.t), metav1.ListOptions{Limit: 1})
		if err != nil {
			return fmt.Errorf("list EndpointSlices: %w", err)
		}
		count := func(items int, rest *int64) int {
			if rest != nil {
				return items + int(*rest)
			}
			return items
		}
		got, gotSlices := count(len(svcs.Items), svcs.RemainingItemCount), count(len(sls.Items), sls.RemainingItemCount)
		if got >= n && gotSlices >= n {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the API server serves %d Services and %d EndpointSlices of the %d written into etcd", got, gotSlices, n)
		}
		time.Sleep(200 * time.Millisecond)
	}
}
