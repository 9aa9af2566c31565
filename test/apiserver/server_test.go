package apiserver_test

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kpproxy/kp/test/apiserver"
	"github.com/kpproxy/kp/test/netns"
)

func TestMain(m *testing.M) { os.Exit(netns.Main(m)) }

func TestServerServesTheReleaseOnlyInsideTheTestNamespaces(t *testing.T) {
	srv := apiserver.Start(t, apiserver.Options{Instances: 2})
	ctx := context.Background()

	v, err := srv.Client().Discovery().ServerVersion()
	if err != nil {
		t.Fatalf("server version: %v", err)
	}
	dir, _ := apiserver.BinDir()
	if !strings.Contains(dir, "kube-"+v.GitVersion+"-") {
		t.Errorf("server reports %s; the binaries are %s", v.GitVersion, dir)
	}
	out, err := srv.Kubectl("version")
	if err != nil || !strings.Contains(out, "Client Version: "+v.GitVersion) {
		t.Errorf("kubectl version: %v\n%s", err, out)
	}
	// Upstream kube-proxy, the benchmarks' reference, is the same release.
	out, err = netns.Exec(srv.NS(), apiserver.Bin(t, apiserver.KubeProxy), "--version")
	if err != nil || !strings.Contains(out, v.GitVersion) {
		t.Errorf("kube-proxy --version: %v\n%s", err, out)
	}
	for _, ns := range []string{"default", "kube-system"} {
		if _, err := srv.Client().CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{}); err != nil {
			t.Errorf("namespace %s: %v", ns, err)
		}
	}

	// Bound to its own address only: nothing listens on a wildcard.
	listening, err := netns.Exec(srv.NS(), "ss", "-ltnH")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(strings.TrimSpace(listening), "\n") {
		f := strings.Fields(l)
		if len(f) < 4 {
			continue
		}
		local := f[3]
		if strings.HasPrefix(local, "0.0.0.0:") || strings.HasPrefix(local, "*:") || strings.HasPrefix(local, "[::]:") {
			t.Errorf("something listens on a wildcard address in the API server's namespace: %s", l)
		}
	}
	if !strings.Contains(listening, srv.Instance(0).Addr.String()) {
		t.Errorf("instance 0 does not listen on %s:\n%s", srv.Instance(0).Addr, listening)
	}

	// A connected namespace reaches every instance; a stopped instance
	// comes back.
	other := netns.NewNamespace(t, "peer")
	srv.Connect(other)
	for _, inst := range srv.Instances() {
		c, err := netns.DialConn(ctx, other, "tcp", inst.Addr.String())
		if err != nil {
			t.Errorf("from a connected namespace to %s: %v", inst.Addr, err)
			continue
		}
		c.Close()
	}
	first := srv.Instance(0)
	if err := first.Stop(); err != nil {
		t.Fatalf("stop instance 0: %v", err)
	}
	if _, err := srv.Client().CoreV1().Namespaces().List(ctx, metav1.ListOptions{}); err != nil {
		t.Errorf("instance 1 while instance 0 is stopped: %v", err)
	}
	start := time.Now()
	if err := first.Start(); err != nil {
		t.Fatalf("start instance 0 again: %v", err)
	}
	t.Logf("instance 0 ready again after %v", time.Since(start).Round(time.Millisecond))
}
