package userspace

import (
	"context"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/kpproxy/kp/proxy"
)

// TestKernelAffinityEntryNamesTheEndpointThatAnswered: a connection to a
// ClusterIP with ClientIP affinity leaves the client remembered with the
// endpoint that answered, and ListAffinity lists that entry with the
// timeout's life left.
func TestKernelAffinityEntryNamesTheEndpointThatAnswered(t *testing.T) {
	k := newKernelWorld(t, 2)
	pods := k.w.Pods()
	web := k.add("web", v1.ProtocolTCP, "10.96.0.10", 80, 0, pods[0].IP.String()+":8080", pods[1].IP.String()+":8080")
	k.st.Services[web].AffinityTimeout = time.Hour
	k.sync()
	name, err := k.ask(k.w.Client(), "tcp", "10.96.0.10:80")
	if err != nil {
		t.Fatal(err)
	}
	answered := map[string]string{"pod-0": pods[0].IP.String() + ":8080", "pod-1": pods[1].IP.String() + ":8080"}[name]
	entries, err := k.b.ListAffinity(context.Background(), k.st)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 1 {
		t.Fatalf("affinity entries %+v, want one, of %s to %s (%s)", entries, k.w.ClientIP(), answered, name)
	}
	e := entries[0]
	if e.ServicePort != web || e.Traffic != proxy.AffinityInternal || e.Client != k.w.ClientIP() || e.Endpoint.String() != answered || e.Expires <= 55*time.Minute || e.Expires > time.Hour {
		t.Errorf("entry %+v, want %s pinned to %s (%s, which answered) for about an hour", e, k.w.ClientIP(), answered, name)
	}
}
