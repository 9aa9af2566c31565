package bench

import (
	"flag"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Populating the API server under the VM's software emulation is the slow
// part of a run there (the API server's CPU per object, emulated). A seed
// is the data folder of an etcd populated on the host with the same code
// and stopped cleanly: the run in the VM starts its etcd on a copy, and
// its Services are there from the start.
var flagSeed = flag.String("bench.seed", "", "etcd data folder to start the API server's etcd on (made by seedEtcd); its Services are adopted")

// seedEtcd populates an API server of its own with n Services (as grow
// does), stops it cleanly and copies its etcd data folder to dst; it
// returns how long the population took.
func seedEtcd(t *testing.T, n int, dst string) time.Duration {
	t.Helper()
	var took time.Duration
	t.Run(fmt.Sprintf("seed N=%d", n), func(t *testing.T) {
		c := newClusterWith(t, serverOptions(""))
		took = c.grow(n)
		if err := c.srv.Stop(); err != nil {
			t.Fatalf("stop the seed's API server: %v", err)
		}
		if out, err := exec.Command("cp", "-a", c.srv.EtcdDataDir(), dst).CombinedOutput(); err != nil {
			t.Fatalf("copy the seed: %v: %s", err, out)
		}
	})
	if t.Failed() {
		t.FailNow()
	}
	return took
}

// adopt fills c's ClusterIPs from the Services the seed holds: svc-00000
// to svc-(k-1), k of them.
func (c *cluster) adopt() {
	c.t.Helper()
	list, err := c.api.CoreV1().Services(namespace).List(ctx(c.t), metav1.ListOptions{})
	if err != nil {
		c.t.Fatalf("list the seed's Services: %v", err)
	}
	ips := make([]string, len(list.Items))
	for _, svc := range list.Items {
		i, err := strconv.Atoi(strings.TrimPrefix(svc.Name, "svc-"))
		if err != nil || !strings.HasPrefix(svc.Name, "svc-") || i >= len(ips) {
			c.t.Fatalf("the seed holds Service %s/%s, not one of svc-00000 to svc-%05d", namespace, svc.Name, len(ips)-1)
		}
		ips[i] = svc.Spec.ClusterIP
	}
	c.mu.Lock()
	c.clusterIPs = ips
	c.mu.Unlock()
	c.t.Logf("adopted %d Services from the etcd seed", len(ips))
}
