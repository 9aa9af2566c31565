package cluster

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestPodExecRunsKPStatusInKPsContainerWithItsSocket(t *testing.T) {
	pod := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "kube-system", Name: "kp-abc"},
		Spec: v1.PodSpec{Containers: []v1.Container{
			{Name: "sidecar", Command: []string{"/bin/sh"}},
			{Name: "kp", Command: []string{"/usr/local/bin/kp", "proxy", "--status-socket", "/run/x/kp.sock"}},
		}}}
	var ran [][]string
	var containers []string
	p := PodExec{exec: func(_ context.Context, got *v1.Pod, container string, cmd []string) ([]byte, error) {
		if got != pod {
			t.Errorf("exec in %s, want %s", got.Name, pod.Name)
		}
		ran, containers = append(ran, cmd), append(containers, container)
		if slices.Contains(cmd, "--inventory") {
			return []byte(`{"node":"n1","programs":[{"owner":"kube-proxy","mode":"iptables/ipvs","where":"iptables-nft IPv4","chains":3,"rules":9}]}`), nil
		}
		return []byte(`{"apiVersion":"kp/v1","mode":"nftables","node":"n1","healthy":true}`), nil
	}}
	st, err := p.Status(context.Background(), pod)
	if err != nil || st.Mode != "nftables" || !st.Healthy {
		t.Errorf("Status = %+v, %v", st, err)
	}
	inv, err := p.Inventory(context.Background(), pod)
	if err != nil || len(inv.Programs) != 1 || inv.Programs[0].Owner != "kube-proxy" {
		t.Errorf("Inventory = %+v, %v", inv, err)
	}
	want := [][]string{
		{"/usr/local/bin/kp", "--status-socket=/run/x/kp.sock", "status", "-o", "json"},
		{"/usr/local/bin/kp", "--status-socket=/run/x/kp.sock", "status", "--inventory", "-o", "json"},
	}
	if !slices.EqualFunc(ran, want, slices.Equal) || !slices.Equal(containers, []string{"kp", "kp"}) {
		t.Errorf("ran %q in %q, want %q in kp", ran, containers, want)
	}
}

func TestPodExecErrorsNameThePodAndTheCommand(t *testing.T) {
	pod := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "kube-system", Name: "kp-abc"},
		Spec: v1.PodSpec{Containers: []v1.Container{{Name: "proxy"}}}}
	p := PodExec{exec: func(context.Context, *v1.Pod, string, []string) ([]byte, error) {
		return nil, errors.New(`pods "kp-abc" is forbidden: User "ops" cannot create resource "pods/exec"`)
	}}
	_, err := p.Status(context.Background(), pod)
	if err == nil || !strings.Contains(err.Error(), `exec "kp status -o json" in pod kube-system/kp-abc`) || !strings.Contains(err.Error(), "pods/exec") {
		t.Errorf("Status error = %v", err)
	}
	p.exec = func(context.Context, *v1.Pod, string, []string) ([]byte, error) {
		return []byte("kp: unknown command"), nil
	}
	if _, err := p.Inventory(context.Background(), pod); err == nil {
		t.Error("Inventory decoded output that is not JSON")
	}
	if _, err := (PodExec{}).Status(context.Background(), pod); err == nil || !strings.Contains(err.Error(), "no API client configuration") {
		t.Errorf("without a configuration: %v", err)
	}
}
