package cluster

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"path"
	"strings"

	v1 "k8s.io/api/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/remotecommand"
	"k8s.io/streaming/pkg/httpstream"

	"github.com/kpproxy/kp/proxy/statusapi"
)

// PodExec reads a node's kp as kubectl exec would: it runs kp status -o
// json (and --inventory) in the kp pod's container, through the API
// server's pods/exec subresource, and decodes what it prints. kp serves
// its status on a Unix socket only root on the node opens, never on the
// network, so this is the way in from outside the node, and the caller's
// RBAC (create pods/exec in kp's namespace) is its gate; the API server
// audits every call.
type PodExec struct {
	// Config is the API client's configuration (credentials, server).
	Config *rest.Config
	// Container is kp's container in the pod; "" means the one named kp,
	// else the first.
	Container string

	// exec runs cmd in the pod's container and returns its standard
	// output (tests replace it); nil runs it through the API server.
	exec func(ctx context.Context, pod *v1.Pod, container string, cmd []string) ([]byte, error)
}

// Status runs kp status -o json in the pod.
func (p PodExec) Status(ctx context.Context, pod *v1.Pod) (*statusapi.Status, error) {
	var st statusapi.Status
	return &st, p.run(ctx, pod, &st, "status", "-o", "json")
}

// Inventory runs kp status --inventory -o json in the pod.
func (p PodExec) Inventory(ctx context.Context, pod *v1.Pod) (*statusapi.Inventory, error) {
	var inv statusapi.Inventory
	return &inv, p.run(ctx, pod, &inv, "status", "--inventory", "-o", "json")
}

func (p PodExec) run(ctx context.Context, pod *v1.Pod, out any, args ...string) error {
	container, cmd := kpCommand(pod, p.Container)
	cmd = append(cmd, args...)
	exec := p.exec
	if exec == nil {
		exec = p.execAPI
	}
	stdout, err := exec(ctx, pod, container, cmd)
	if err != nil {
		return fmt.Errorf("exec %q in pod %s/%s: %w", strings.Join(cmd, " "), pod.Namespace, pod.Name, err)
	}
	if err := json.Unmarshal(stdout, out); err != nil {
		return fmt.Errorf("exec %q in pod %s/%s: %w", strings.Join(cmd, " "), pod.Namespace, pod.Name, err)
	}
	return nil
}

// kpCommand finds kp's container in pod and the command line that runs
// its kp binary there with its status socket: the container's own
// command[0] (/usr/local/bin/kp in kp's manifests) and its
// --status-socket, when the DaemonSet sets one.
func kpCommand(pod *v1.Pod, name string) (string, []string) {
	var c *v1.Container
	for i := range pod.Spec.Containers {
		if cc := &pod.Spec.Containers[i]; cc.Name == name || name == "" && cc.Name == "kp" {
			c = cc
		}
	}
	if c == nil && len(pod.Spec.Containers) > 0 {
		c = &pod.Spec.Containers[0]
	}
	if c == nil {
		return name, []string{"kp"}
	}
	bin := "kp"
	if len(c.Command) > 0 && path.Base(c.Command[0]) == "kp" {
		bin = c.Command[0]
	}
	cmd := []string{bin}
	all := append(append([]string(nil), c.Command...), c.Args...)
	for i, a := range all {
		if v, ok := strings.CutPrefix(a, "--status-socket="); ok {
			cmd = append(cmd, "--status-socket="+v)
		} else if a == "--status-socket" && i+1 < len(all) {
			cmd = append(cmd, "--status-socket="+all[i+1])
		}
	}
	return c.Name, cmd
}

// execAPI runs cmd through POST .../pods/NAME/exec: WebSocket first, SPDY
// when the API server does not upgrade to it, as kubectl exec does.
func (p PodExec) execAPI(ctx context.Context, pod *v1.Pod, container string, cmd []string) ([]byte, error) {
	if p.Config == nil {
		return nil, fmt.Errorf("no API client configuration to exec with")
	}
	base, _, err := rest.DefaultServerUrlFor(p.Config)
	if err != nil {
		return nil, err
	}
	u := *base
	u.Path = path.Join(u.Path, "/api/v1/namespaces", pod.Namespace, "pods", pod.Name, "exec")
	q := url.Values{"container": {container}, "stdout": {"true"}, "stderr": {"true"}, "command": cmd}
	u.RawQuery = q.Encode()
	spdy, err := remotecommand.NewSPDYExecutor(p.Config, "POST", &u)
	if err != nil {
		return nil, err
	}
	ws, err := remotecommand.NewWebSocketExecutor(p.Config, "GET", u.String())
	if err != nil {
		return nil, err
	}
	ex, err := remotecommand.NewFallbackExecutor(ws, spdy, func(err error) bool {
		return httpstream.IsUpgradeFailure(err) || httpstream.IsHTTPSProxyError(err)
	})
	if err != nil {
		return nil, err
	}
	var stdout, stderr bytes.Buffer
	if err := ex.StreamWithContext(ctx, remotecommand.StreamOptions{Stdout: &stdout, Stderr: &stderr}); err != nil {
		if msg := strings.TrimSpace(stderr.String()); msg != "" {
			return nil, fmt.Errorf("%w: %s", err, msg)
		}
		return nil, err
	}
	return stdout.Bytes(), nil
}
