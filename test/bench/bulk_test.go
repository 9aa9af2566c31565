package bench

import (
	"context"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kpproxy/kp/test/netns"
)

// The bulk measurement: one long TCP connection through a proxy vs
// direct. A sink in the world's first pod reads everything and answers
// with the byte count; Service "bulk" (its own port, so the proxies'
// Service counts leave it out) has the sink as its one endpoint.
const (
	bulkService = "bulk"
	bulkPort    = 81   // the Service's port
	sinkPort    = 9000 // the sink's, in the pod
)

// startSink runs the sink in namespace ns until the test ends.
func startSink(t *testing.T, ns string) {
	t.Helper()
	netns.Serve(t, ns, fmt.Sprintf(":%d", sinkPort), func(c net.Conn) {
		n, _ := io.Copy(io.Discard, c)
		fmt.Fprintf(c, "%d\n", n)
	})
}

// pointBulk creates Service bulk (once) and points its endpoints at the
// sink in pod; it returns the Service's address.
func (c *cluster) pointBulk(pod string) string {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	svcs := c.api.CoreV1().Services(namespace)
	svc, err := svcs.Get(ctx, bulkService, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		svc, err = svcs.Create(ctx, &v1.Service{
			ObjectMeta: metav1.ObjectMeta{Name: bulkService, Namespace: namespace},
			Spec:       v1.ServiceSpec{Ports: []v1.ServicePort{{Name: "bulk", Protocol: v1.ProtocolTCP, Port: bulkPort}}},
		}, metav1.CreateOptions{})
	}
	if err != nil {
		c.t.Fatalf("Service %s/%s: %v", namespace, bulkService, err)
	}
	ready := true
	sl := &discovery.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Name: bulkService, Namespace: namespace,
			Labels: map[string]string{discovery.LabelServiceName: bulkService}},
		AddressType: discovery.AddressTypeIPv4,
		Ports:       []discovery.EndpointPort{{Name: ptr("bulk"), Protocol: ptr(v1.ProtocolTCP), Port: ptr(int32(sinkPort))}},
		Endpoints:   []discovery.Endpoint{{Addresses: []string{pod}, Conditions: discovery.EndpointConditions{Ready: &ready}}},
	}
	slices := c.api.DiscoveryV1().EndpointSlices(namespace)
	if cur, err := slices.Get(ctx, bulkService, metav1.GetOptions{}); err == nil {
		sl.ResourceVersion = cur.ResourceVersion
		_, err = slices.Update(ctx, sl, metav1.UpdateOptions{})
		if err != nil {
			c.t.Fatalf("EndpointSlice %s/%s: %v", namespace, bulkService, err)
		}
	} else if _, err := slices.Create(ctx, sl, metav1.CreateOptions{}); err != nil {
		c.t.Fatalf("EndpointSlice %s/%s: %v", namespace, bulkService, err)
	}
	return net.JoinHostPort(svc.Spec.ClusterIP, strconv.Itoa(bulkPort))
}

// sendBulk sends as much as it can to addr from namespace ns for window,
// half-closes, and returns what the sink says it received and the time
// until it said so.
func sendBulk(ns, addr string, window time.Duration) (int64, time.Duration, error) {
	var got int64
	var took time.Duration
	err := netns.InNamespace(ns, func() error {
		c, err := net.DialTimeout("tcp", addr, 2*time.Second)
		if err != nil {
			return err
		}
		defer c.Close()
		buf := make([]byte, 256<<10)
		start := time.Now()
		end := start.Add(window)
		_ = c.SetDeadline(end.Add(10 * time.Second))
		for time.Now().Before(end) {
			if _, err := c.Write(buf); err != nil {
				return err
			}
		}
		if err := c.(*net.TCPConn).CloseWrite(); err != nil {
			return err
		}
		reply, err := io.ReadAll(c)
		took = time.Since(start)
		if err != nil {
			return err
		}
		got, err = strconv.ParseInt(strings.TrimSpace(string(reply)), 10, 64)
		if err != nil {
			return fmt.Errorf("sink's reply %q: %w", reply, err)
		}
		return nil
	})
	return got, took, err
}

// bulk measures one bulk transfer of cfg.Window to addr from the world's
// client, once addr answers (a proxy programs a new Service within its
// sync); ok is false (and t failed) when it did not.
func bulk(t *testing.T, w *netns.World, proxy string, n int, addr string, cfg config) (Bulk, bool) {
	t.Helper()
	var err error
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if _, _, err = sendBulk(w.Client(), addr, time.Millisecond); err == nil {
			break
		}
	}
	if err != nil {
		t.Errorf("%s N=%d: the bulk sink at %s does not answer: %v", proxy, n, addr, err)
		return Bulk{}, false
	}
	bytes, took, err := sendBulk(w.Client(), addr, cfg.Window)
	if err != nil {
		t.Errorf("%s N=%d: bulk transfer to %s: %v", proxy, n, addr, err)
		return Bulk{}, false
	}
	return Bulk{Proxy: proxy, N: n, Bytes: bytes, Seconds: took.Seconds(), MBps: float64(bytes) / took.Seconds() / 1e6}, true
}
