package cluster

import (
	"context"
	"encoding/json"
	"fmt"

	v1 "k8s.io/api/core/v1"

	"github.com/kpproxy/kp/internal/kubeclient"
	"github.com/kpproxy/kp/proxy/statusapi"
)

// DefaultHealthzPort is kp's healthz port (upstream's 10256), where kp
// serves its read-only status and inventory on every address.
const DefaultHealthzPort = "10256"

// PodProxy reads kp's status through the API server's pod proxy:
// /api/v1/namespaces/NS/pods/POD:PORT/proxy/kp/v1/status. A hostNetwork
// pod's address is its node's, so this reaches the node's kp from wherever
// the API server is reachable, with the caller's credentials (pods/proxy).
type PodProxy struct {
	Client kubeclient.Interface
	Port   string // "" : DefaultHealthzPort
}

func (p PodProxy) get(ctx context.Context, pod *v1.Pod, path string, out any) error {
	port := p.Port
	if port == "" {
		port = DefaultHealthzPort
	}
	body, err := p.Client.CoreV1().Pods(pod.Namespace).ProxyGet("http", pod.Name, port, path, nil).DoRaw(ctx)
	if err != nil {
		return fmt.Errorf("GET %s from pod %s/%s port %s through the API server: %w", path, pod.Namespace, pod.Name, port, err)
	}
	if err := json.Unmarshal(body, out); err != nil {
		return fmt.Errorf("GET %s from pod %s/%s: %w", path, pod.Namespace, pod.Name, err)
	}
	return nil
}

// Status reads GET /kp/v1/status.
func (p PodProxy) Status(ctx context.Context, pod *v1.Pod) (*statusapi.Status, error) {
	var st statusapi.Status
	return &st, p.get(ctx, pod, statusapi.StatusPath, &st)
}

// Inventory reads GET /kp/v1/inventory.
func (p PodProxy) Inventory(ctx context.Context, pod *v1.Pod) (*statusapi.Inventory, error) {
	var inv statusapi.Inventory
	return &inv, p.get(ctx, pod, statusapi.InventoryPath, &inv)
}
